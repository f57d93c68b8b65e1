"""Direct dispatch, a frontend worker's side: the stubs it sends to, what waits for each
request sent, and the routes (``direct.py`` sends and reads through them)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final, Protocol

from shoal.frontends.workers.direct_records import Answer
from shoal.ipc.arena import Block
from shoal.ipc.queue import Channel

__all__ = ["InputArena", "Route", "Stub", "Waiting", "least_busy", "monotonic_ns", "split_routes"]

#: The clock of a request's statistics, bound once: compiled, a Final is a C static, where
#: ``time.monotonic_ns`` is an attribute look-up on the module at every call.
monotonic_ns: Final = time.monotonic_ns


class InputArena(Protocol):
    """The worker's input arena (``arenas.StagingArena``), as direct dispatch uses it."""

    @property
    def arena_id(self) -> int: ...

    def view(self, block: Block) -> memoryview: ...

    def free_blocks(self, blocks: list[Block]) -> None: ...


class Stub:
    """One stub this worker has a direct channel to."""

    def __init__(self, pid: int, name: str, channel: Channel, pidfd: int | None) -> None:
        self.pid = pid
        #: Its instance's name (errors name it as the core's do).
        self.name = name
        self.channel = channel
        self.pidfd = pidfd
        #: What waits for each Execute sent, by batch id.
        self.pending: dict[int, Waiting] = {}
        #: The segments of this worker's input arena the core has given the stub.
        self.segments: set[int] = set()
        self.dead = False


class Waiting:
    """One request sent to a stub, until its Result."""

    __slots__ = ("future", "inputs", "route", "sent_ns", "started_ns")

    def __init__(
        self,
        future: asyncio.Future[Answer],
        route: Route,
        started_ns: int,
        inputs: list[Block],
    ) -> None:
        self.future = future
        self.route = route
        self.started_ns = started_ns
        #: Its inputs' blocks in the worker's arena, freed once the stub is done with them.
        self.inputs = inputs
        self.sent_ns = monotonic_ns()


class Route:
    """A version this worker sends to directly: its stubs and what it has in flight there."""

    def __init__(
        self, slot: int, generation: int, label: str, stubs: list[Stub], turn: int, row: int
    ) -> None:
        self.slot = slot
        #: The row of this worker's statistics counters that counts the version's requests.
        self.row = row
        #: Where the next choice of a stub starts among equals (``_least_busy``).
        self.turn = turn
        self.generation = generation
        self.label = label
        self.stubs = stubs
        self.in_flight = 0
        #: The revocation tokens to answer once nothing is in flight (``revoke``).
        self.revoked: list[int] = []


def least_busy(stubs: list[Stub], turn: int) -> Stub | None:
    """The live stub with the fewest of this worker's requests; among equals, the first from
    ``turn`` on (each worker starts at its own number and moves on by one per request, so that
    workers that each see idle stubs do not all pick the same one)."""
    best: Stub | None = None
    count = len(stubs)
    for step in range(count):
        stub = stubs[(turn + step) % count]
        if not stub.dead and (best is None or len(stub.pending) < len(best.pending)):
            best = stub
    return best


Routes = dict[tuple[str, str], Route | float]


def split_routes(routes: Routes, which: Callable[[Route], bool]) -> tuple[Routes, list[Route]]:
    """The routes to keep, and those ``which`` picks to forget (their requests in flight go
    on)."""
    kept: Routes = {}
    dropped: list[Route] = []
    for key, route in routes.items():
        if isinstance(route, Route) and which(route):
            dropped.append(route)
        else:
            kept[key] = route
    return kept, dropped
