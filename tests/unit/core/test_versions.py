"""Requested version strings read as Triton's GetModelVersionFromString reads them."""

from __future__ import annotations

import pytest

from shoal.core.errors import InvalidArgument
from shoal.core.versions import check_version, version_number

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("text", "number"),
    [("1", 1), ("007", 7), ("9223372036854775807", 2**63 - 1), ("0" * 40 + "3", 3)],
)
def test_a_version_is_read_as_a_number(text, number):
    assert version_number(text) == number
    check_version(text)


@pytest.mark.parametrize("text", ["wrong", "1.5", "٣", "9223372036854775808", "1" * 20, "9" * 5000])
def test_a_string_that_is_not_an_int64_is_tritons_invalid_argument(text):
    """A 5,000-digit version was a 500 with a traceback: Python's int() refuses over 4,300
    digits, and nothing caught its ValueError."""
    for check in (version_number, check_version):
        with pytest.raises(InvalidArgument) as caught:
            check(text)
        assert caught.value.message == (
            f"failed to get model version from specified version string '{text}' "
            "(details: stol), version should be an integral value > 0"
        )


def test_a_negative_version_is_refused_in_tritons_words():
    with pytest.raises(InvalidArgument) as caught:
        version_number("-3")
    assert caught.value.message == (
        "invalid model version specified '-3' , version should be an integral value > 0"
    )


def test_no_version_requested_is_fine():
    check_version("")
