"""Triton's model repository extension: the bodies of ``POST /v2/repository/...``.

* index: request ``{"ready": bool}`` (optional); response a list of ``{"name", "version",
  "state", "reason"}`` where, as Triton writes it, empty fields are left out;
* load: request ``{"parameters": {"config": "<model config JSON>", "file:<path>": "<base64>"}}``
  (optional); files travel base64-encoded over HTTP and reach the core as bytes;
* unload: request ``{"parameters": {"unload_dependents": bool}}`` (optional).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from shoal.core import InvalidArgument, RepositoryEntry
from shoal.frontends.http._document import optional_bool, optional_object, parse_object

_FILE_PREFIX = "file:"


@dataclass(frozen=True)
class LoadRequest:
    """What a load request asks of the core: ``None`` for what the client did not send."""

    config_json: str | None = None
    files: dict[str, bytes] | None = None


def parse_index_request(body: bytes | bytearray | memoryview) -> bool:
    """The request's ``ready`` flag: list only the models that are ready."""
    return optional_bool(parse_object(body), "ready")


def repository_index_json(entries: list[RepositoryEntry]) -> list[dict[str, str]]:
    """The index body; empty fields are left out, as Triton does."""
    return [_entry_json(entry) for entry in entries]


def _entry_json(entry: RepositoryEntry) -> dict[str, str]:
    fields = {
        "name": entry.name,
        "version": entry.version,
        "state": entry.state,
        "reason": entry.reason,
    }
    return {key: value for key, value in fields.items() if key == "name" or value}


def parse_load_request(body: bytes | bytearray | memoryview) -> LoadRequest:
    """The model configuration and the files (keys "file:<path>", decoded) of a load request."""
    parameters = optional_object(parse_object(body), "parameters")
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if not isinstance(value, str):
            raise InvalidArgument(f"Unable to parse '{key}': expected a string")
        if key == "config":
            config = value
        elif key.startswith(_FILE_PREFIX) and len(key) > len(_FILE_PREFIX):
            files[key] = _decode_base64(key, value)
        else:
            raise InvalidArgument(
                f"unexpected load parameter '{key}': expected 'config' or 'file:<path>'"
            )
    return LoadRequest(config, files or None)


def _decode_base64(key: str, value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument(f"Unable to parse '{key}': invalid base64 content ({exc})") from None


def parse_unload_request(body: bytes | bytearray | memoryview) -> bool:
    """The request's ``unload_dependents`` flag."""
    parameters: dict[str, Any] = optional_object(parse_object(body), "parameters")
    return optional_bool(parameters, "unload_dependents")
