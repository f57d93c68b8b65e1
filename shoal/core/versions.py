"""A requested model version string read as Triton reads it (``GetModelVersionFromString``)."""

from __future__ import annotations

from shoal.core.errors import InvalidArgument

#: Triton reads the string with ``std::stol``: past int64 it is not a version.
_INT64_DIGITS = len(str(2**63 - 1))
_INT64_MAX = 2**63 - 1


def version_number(version: str) -> int:
    """``version`` (not "") as a number; Triton's error for a string that is not a version, a
    negative one, or one past int64 (a few thousand digits would otherwise fail Python's own
    int() limit as an internal error)."""
    negative = version[:1] == "-"
    digits = version[1:] if negative else version
    if digits.isascii() and digits.isdigit():
        significant = digits.lstrip("0")
        if len(significant) <= _INT64_DIGITS and int(significant or "0") <= _INT64_MAX:
            if negative:
                raise InvalidArgument(
                    f"invalid model version specified '{version}' , "
                    "version should be an integral value > 0"
                )
            return int(significant or "0")
    raise InvalidArgument(
        f"failed to get model version from specified version string '{version}' "
        "(details: stol), version should be an integral value > 0"
    )


def check_version(version: str) -> None:
    """Refuse a requested version string that is not a version ("": none requested, fine)."""
    if version and not (version.isascii() and version.isdigit() and len(version) < 19):
        version_number(version)
