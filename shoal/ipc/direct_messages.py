"""The messages that open and close a frontend worker's direct channel to a stub.

Direct dispatch (docs/decisions.md): the core makes a channel per (worker, instance), sends the
stub its five fds on the stub's Unix socket (:class:`DirectChannelAnnounce`), then
:class:`DirectAttach` on the core's ring, which tells the stub to read them and serve that ring
too; :class:`DirectDetach` closes it (the worker exited, or the core took its routes back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack


@dataclass(slots=True)
class DirectAttach:
    """Serve worker ``origin``'s direct ring; its fds wait on the stub's socket. ``pid``: the
    worker's process, whose exit ends a wait for room in its ring."""

    origin: int
    pid: int

    def fields(self) -> list[Any]:
        return [self.origin, self.pid]

    @classmethod
    def from_fields(cls, f: list[Any]) -> DirectAttach:
        return cls(f[0], f[1])


@dataclass(slots=True)
class DirectDetach:
    """Stop serving worker ``origin``'s direct ring and close it."""

    origin: int

    def fields(self) -> list[Any]:
        return [self.origin]

    @classmethod
    def from_fields(cls, f: list[Any]) -> DirectDetach:
        return cls(f[0])


@dataclass(slots=True)
class DirectChannelAnnounce:
    """The payload sent with a direct channel's five fds: on a stub's socket, ``key`` is the
    worker's number (its origin); on a worker's segment socket, the stub's pid."""

    key: int

    def encode(self) -> bytes:
        return msgpack.packb(["direct", self.key])  # type: ignore[no-any-return]
