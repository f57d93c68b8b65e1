"""Open the fsspec file system of a remote repository; back-ends are imported only when used.

This is the one place that reads the object stores' environment variables. Credentials are left
to each back-end's own chain (for S3: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
AWS_PROFILE, instance roles); the endpoint and region are read here so that every botocore version
honours them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from shoal.supervisor.models.remote_repository._errors import RemoteRepositoryError
from shoal.supervisor.models.remote_repository._location import RemoteLocation

#: fsspec protocol -> the module that implements it (what the extra installs).
_BACKENDS = {"s3": "s3fs", "gcs": "gcsfs", "abfs": "adlfs"}


def _first(environ: Mapping[str, str], *names: str) -> str:
    for name in names:
        if environ.get(name):
            return environ[name]
    return ""


def storage_options(location: RemoteLocation, environ: Mapping[str, str]) -> dict[str, Any]:
    """The keyword arguments of the back-end's file system for ``location``."""
    if location.protocol == "s3":
        client: dict[str, str] = {}
        # The URL's host:port (Triton's form) wins over the environment.
        endpoint = location.endpoint or _first(environ, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
        if endpoint:
            client["endpoint_url"] = endpoint
        region = _first(environ, "AWS_REGION", "AWS_DEFAULT_REGION")
        if region:
            client["region_name"] = region
        return {"client_kwargs": client} if client else {}
    if location.protocol == "abfs":
        options: dict[str, Any] = {}
        # Triton's variables; adlfs reads its own AZURE_STORAGE_* ones when these are absent.
        account = location.account or _first(environ, "AZURE_STORAGE_ACCOUNT")
        if account:
            options["account_name"] = account
        key = _first(environ, "AZURE_STORAGE_KEY")
        if key:
            options["account_key"] = key
        return options
    return {}


def open_filesystem(location: RemoteLocation, environ: Mapping[str, str]) -> Any:
    """An fsspec file system for ``location``, or an error naming the extra to install."""
    module = _BACKENDS[location.protocol]
    try:
        importlib.import_module(module)
        fsspec = importlib.import_module("fsspec")
    except ImportError:
        raise RemoteRepositoryError(
            f"model repository '{location.url}' needs the '{module}' package: "
            f"pip install 'shoal[{location.extra}]'"
        ) from None
    try:
        # A private instance, whose settings no other user of fsspec in this process shares.
        return fsspec.filesystem(
            location.protocol, skip_instance_cache=True, **storage_options(location, environ)
        )
    except Exception as error:  # a back-end's own configuration errors, of many types
        raise RemoteRepositoryError(
            f"model repository '{location.url}' cannot be opened: {error}"
        ) from error
