"""Parse ``--model-repository`` URLs of object stores into what an fsspec back-end needs."""

from __future__ import annotations

import re
from dataclasses import dataclass

from shoal.supervisor.models.remote_repository._errors import RemoteRepositoryError

#: URL scheme -> (fsspec protocol, the shoal extra that installs its back-end).
_SCHEMES: dict[str, tuple[str, str]] = {
    "s3": ("s3", "s3"),
    "gs": ("gcs", "gcs"),
    "az": ("abfs", "azure"),
    "as": ("abfs", "azure"),  # Triton's spelling: as://account/container/path
}

#: Triton's private-S3 form: ``s3://[http://|https://]host:port/bucket/path``.
_S3_ENDPOINT = re.compile(r"^(?:(?P<scheme>https?)://)?(?P<host>[0-9A-Za-z.\-]+):(?P<port>\d+)/")


@dataclass(frozen=True)
class RemoteLocation:
    """Where a remote model repository lives: ``bucket/prefix`` under an fsspec ``protocol``.

    ``endpoint`` is set by Triton's ``s3://host:port/bucket/path`` form, ``account`` by Triton's
    ``as://account/container/path``; both are empty otherwise (the environment decides).
    """

    url: str
    protocol: str
    extra: str
    bucket: str
    prefix: str = ""
    endpoint: str = ""
    account: str = ""

    @property
    def root(self) -> str:
        """``bucket/prefix`` as fsspec names it, without a trailing slash."""
        return f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket


def is_remote(location: str) -> bool:
    """Whether ``--model-repository`` names an object store rather than a local directory."""
    return "://" in location


def parse_location(url: str) -> RemoteLocation:
    """``s3://bucket/prefix`` (and the other schemes) -> :class:`RemoteLocation`."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in _SCHEMES:
        known = ", ".join(f"{s}://" for s in _SCHEMES)
        raise RemoteRepositoryError(
            f"model repository '{url}': unsupported scheme '{scheme}://'; shoal reads {known} "
            "and local directories"
        )
    protocol, extra = _SCHEMES[scheme.lower()]
    endpoint, account, rest = _endpoint_and_account(scheme.lower(), rest)
    parts = _path_parts(url, scheme, rest, account)
    return RemoteLocation(
        url=url,
        protocol=protocol,
        extra=extra,
        bucket=parts[0],
        prefix="/".join(parts[1:]),
        endpoint=endpoint,
        account=account,
    )


def _endpoint_and_account(scheme: str, rest: str) -> tuple[str, str, str]:
    """An S3 location's own endpoint (``s3://host:port/bucket``) and an Azure location's
    account (``as://account/container``), each taken off the rest of the location."""
    if scheme == "s3":
        match = _S3_ENDPOINT.match(rest)
        if match is not None:
            endpoint = f"{match['scheme'] or 'http'}://{match['host']}:{match['port']}"
            return endpoint, "", rest[match.end() :]
    elif scheme == "as":
        account, _, rest = rest.partition("/")
        return "", account, rest
    return "", "", rest


def _path_parts(url: str, scheme: str, rest: str, account: str) -> list[str]:
    """The bucket (or container) and the path in it."""
    parts = [p for p in rest.split("/") if p]
    if not parts or (scheme.lower() == "as" and not account):
        where = "account/container" if scheme.lower() == "as" else "bucket"
        raise RemoteRepositoryError(
            f"model repository '{url}' names no {where}; expected {scheme}://{where}/path"
        )
    if any(p in (".", "..") for p in parts):
        raise RemoteRepositoryError(f"model repository '{url}': '.' and '..' are not allowed")
    return parts
