"""Direct dispatch, the core's side: channels from frontend workers straight to stubs.

A plain model version (what ``requests/packed.py`` lets workers pack, and no rate limiter,
trace or response cache) is served by the frontend workers without the core in the request's
path (docs/decisions.md, "Direct dispatch"): a worker asks once for a route
(:meth:`DirectRoutes.grant`), gets a channel to each ready instance's stub, and from then on
writes its packed Executes into those rings and reads the Results from them. The core keeps
what must be global: which versions may be routed so, and when a route must be given back.

* A channel per (worker, stub process), made here: the stub gets its fds on its socket and
  ``DirectAttach`` on the core's ring (it shares the stub's doorbell; the worker's pid, whose
  exit ends a wait for room in the worker's ring), the worker gets them on its segment socket.
  The core keeps no fd of it.
* Before a version drains (unload, reload), :meth:`revoke` takes its routes back: each worker
  holding one stops using it, waits for its requests there to finish, and says so
  (:meth:`released`); only then does the drain go on, so a version never stops under a
  request the core does not see.
* A worker that exits: its channels are detached from the stubs and closed
  (:meth:`worker_gone`). A stub that exits: the workers see it on its pidfd and fail what
  they had sent it; its channels are closed here when next looked at (:meth:`_prune`).
* Statistics: the worker counts each request it routed so, with the times the stub
  reported, before it answers the client, in a row of counters in shared memory that the
  grant names (``direct_counters.py``); the version's statistics add the row when read.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

from shoal.core.errors import ShoalError
from shoal.ipc import messages as msg
from shoal.ipc.fdpass import PeerGone, send_fds
from shoal.ipc.queue import Channel
from shoal.supervisor.direct_counters import DirectCounters
from shoal.supervisor.drain import DrainGate
from shoal.supervisor.extensions.trace_settings import TraceSettings
from shoal.supervisor.instances.process import StubProcess
from shoal.supervisor.models.version import ModelState, ModelVersion
from shoal.supervisor.options import ServerOptions
from shoal.supervisor.requests.packed import PackingSlots, direct_eligible

log = logging.getLogger("shoal")

#: How long a drain waits for the workers to give a version's routes back.
REVOKE_TIMEOUT_S = 30.0

#: ``[slot, generation, version label, [[stub pid, fresh, instance name], ...], row]``
#: (``fresh``: its channel is new, its fds sent now; ``row``: where the worker counts the
#: statistics) and the new channels to send, by stub pid.
Grant = tuple[list[Any], list[tuple[int, Channel]]]


def made(
    options: ServerOptions,
    slots: PackingSlots,
    gate: DrainGate,
    tracing: TraceSettings,
    cache: object | None,
) -> DirectRoutes | None:
    """The routes of a server with frontend workers and ``--direct-dispatch`` (None else)."""
    if options.frontend_workers <= 1 or not options.direct_dispatch:
        return None
    return DirectRoutes(slots, gate, tracing, cache is None)


def origin_of(worker: int) -> int:
    """The number a stub knows worker ``worker``'s ring by (0 is the core's)."""
    return worker + 1


class DirectRoutes:
    """Which workers hold routes to which versions, and their channels."""

    def __init__(
        self, slots: PackingSlots, gate: DrainGate, tracing: TraceSettings, no_cache: bool
    ) -> None:
        self._slots = slots
        self._gate = gate
        self._tracing = tracing
        self._no_cache = no_cache
        #: Each worker's rows of statistics counters.
        self.counters = DirectCounters(slots.loaded)
        #: The stubs each worker has a channel to, by pid.
        self._channels: dict[int, dict[int, StubProcess]] = {}
        #: The versions each worker holds a route to, with the slots it knows them by.
        self._held: dict[int, dict[int, tuple[ModelVersion, set[int]]]] = {}
        self._tokens = itertools.count(1)
        self._waiting: dict[int, tuple[set[int], asyncio.Future[None]]] = {}
        #: Revocations of :meth:`revoke_all`: the workers that have not stopped routing yet.
        self._stops: dict[int, tuple[set[int], asyncio.Future[None]]] = {}
        self._draining: list[asyncio.Future[None]] = []
        #: Asks a worker to give routes back: ``tell(worker, token, slots)`` (the pool sets it).
        self.tell: Callable[[int, int, list[int]], None] | None = None
        #: Tells a worker why a stub it sends to died: ``tell_died(worker, pid, error)``.
        self.tell_died: Callable[[int, int, ShoalError], None] | None = None
        # A drain's requests must meet the closed gate; a model traced now, the core's path.
        gate.on_close.append(self.revoke_all)
        tracing.on_change.append(self.revoke_all)

    def grant(self, worker: int, pid: int, name: str, version: str) -> Grant | None:
        """A route for ``(name, version)`` to worker ``worker`` (process ``pid``); None: its
        requests take the core's way (not a plain version, not ready, draining, traced, no
        ready stub). The caller sends the channels' fds, then :meth:`Channel.forget` s them."""
        mv = self._routable(name, version)
        if mv is None:
            return None
        slot = self._slots.number(name, version)
        if any(i.spec.execute_timeout is not None for i in mv.instances):
            return None  # the core times executes by when it sends them: only it may send
        ready = [i for i in mv.instances if i.ready]
        named = {i.pid: i.name for i in ready}
        procs = [i.process for i in ready]
        stubs = [p for p in procs if isinstance(p, StubProcess) and p.returncode is None]
        if slot is None or not stubs or len(stubs) != len(procs):
            return None
        row = self.counters.row_for(worker, mv)
        if row is None:
            return None
        self._prune(worker)
        channels = self._channels.setdefault(worker, {})
        entries: list[list[Any]] = []
        made: list[tuple[int, Channel]] = []
        for proc in stubs:
            if proc.pid not in channels:
                channel = self._open(worker, pid, proc)
                if channel is None:
                    for _, each in made:
                        each.forget()
                    return None
                channels[proc.pid] = proc
                made.append((proc.pid, channel))
            entries.append([proc.pid, any(p == proc.pid for p, _ in made), named[proc.pid]])
        for instance in mv.instances:
            instance.share_with_workers(self.stub_died)
        held = self._held.setdefault(worker, {})
        if id(mv) not in held:
            log.info(
                "frontend worker %d sends '%s' version %d straight to its %d instance(s)",
                worker,
                mv.name,
                mv.version,
                len(stubs),
            )
        held.setdefault(id(mv), (mv, set()))[1].add(slot)
        return [slot, mv.summary.generation, mv.version_label, entries, row], made

    def _routable(self, name: str, version: str) -> ModelVersion | None:
        try:
            mv = self._slots.loaded.resolve(name, version)
        except ShoalError:
            return None
        if not (self._no_cache and direct_eligible(mv)) or mv.rate_limited or self._gate.closed:
            return None
        if mv.state is not ModelState.READY or mv.down is not None:
            return None
        if self._tracing.traced(mv.name) or mv.stats.overhead is not None:
            return None  # a trace, or --trace-overhead's stages: the core's path to time
        if mv.stats.latencies is not None:
            return None  # latency summaries or histograms: observed per request by the core
        # A GPU instance may answer in GPU memory, which only the core hands on.
        if any(group.kind != "KIND_CPU" for group in mv.config.instance_groups):
            return None
        return mv

    def _open(self, worker: int, pid: int, proc: StubProcess) -> Channel | None:
        """A new channel from ``worker`` to ``proc``, attached at the stub; None: it could not
        be (the stub is exiting, or its ring is full)."""
        channel = Channel.create(proc.channel.ring_capacity, down_bell=proc.channel.down_bell)
        origin = origin_of(worker)
        try:
            send_fds(proc.sock, msg.DirectChannelAnnounce(origin).encode(), channel.child_fds())
            if proc.send(msg.DirectAttach(origin, pid)):
                return channel
        except (PeerGone, OSError):
            pass
        channel.forget()
        return None

    def _prune(self, worker: int) -> None:
        """Forget the stubs of ``worker`` that have exited."""
        channels = self._channels.get(worker, {})
        for pid in [pid for pid, proc in channels.items() if proc.returncode is not None]:
            del channels[pid]

    def stub(self, worker: int, pid: int) -> StubProcess | None:
        """Stub ``pid``, to which worker ``worker`` has a channel, while it runs."""
        proc = self._channels.get(worker, {}).get(pid)
        return proc if proc is not None and proc.returncode is None else None

    def counters_fd(self, worker: int) -> int:
        """The segment of statistics counters worker ``worker`` is started with."""
        return self.counters.fd(worker)

    def stub_died(self, pid: int, error: ShoalError) -> None:
        """Stub ``pid`` died: the workers with a channel to it fail what they had sent it
        with ``error`` (the core's words: the instance, the signal)."""
        for worker, channels in self._channels.items():
            if channels.pop(pid, None) is not None and self.tell_died is not None:
                self.tell_died(worker, pid, error)

    def worker_gone(self, worker: int) -> None:
        """Worker ``worker`` exited: its channels are detached at the stubs, its routes
        forgotten, and it is counted out of the revocations waiting for it."""
        origin = origin_of(worker)
        for proc in self._channels.pop(worker, {}).values():
            if proc.returncode is None:
                try:
                    proc.send(msg.DirectDetach(origin))
                except PeerGone:
                    pass
        self._held.pop(worker, None)
        for token in list(self._waiting):
            self.released(worker, token)
        for token in list(self._stops):
            self.stopped_by(worker, token)

    async def revoke(self, mv: ModelVersion) -> None:
        """Take every route to ``mv`` back, and return once the workers holding one have
        finished their requests on it (or :data:`REVOKE_TIMEOUT_S` passed)."""
        holders: dict[int, list[int]] = {}
        for worker, held in self._held.items():
            found = held.pop(id(mv), None)
            if found is not None:
                holders[worker] = sorted(found[1])
        if not holders or self.tell is None:
            return
        token = next(self._tokens)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[token] = (set(holders), done)
        for worker, slots in holders.items():
            self.tell(worker, token, slots)
        try:
            await asyncio.wait_for(asyncio.shield(done), REVOKE_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning(
                "'%s' version %s: frontend workers did not give its direct routes back in %d s",
                mv.name,
                mv.version,
                REVOKE_TIMEOUT_S,
            )
        finally:
            self._waiting.pop(token, None)

    def revoke_all(self) -> None:
        """Take every route back (the server drains, or the trace settings changed): each
        worker holding one stops using them at once and says so (:meth:`stopped` waits for
        that), then says when its requests on them are done (:meth:`drained`)."""
        tell = self.tell
        held, self._held = self._held, {}
        if tell is None or not held:
            return
        token = next(self._tokens)
        loop = asyncio.get_running_loop()
        done, stopped = loop.create_future(), loop.create_future()
        self._waiting[token] = (set(held), done)
        self._stops[token] = (set(held), stopped)
        self._draining.append(done)
        for worker, versions in held.items():
            slots = sorted({slot for _, taken in versions.values() for slot in taken})
            tell(worker, token, slots)

    async def stopped(self, timeout: float) -> None:
        """Return once every worker told by :meth:`revoke_all` has stopped using its routes
        (or ``timeout`` passed): a request that comes after meets the core."""
        stopping = [stopped for _, stopped in self._stops.values()]
        if stopping:
            await asyncio.wait(stopping, timeout=timeout)

    async def drained(self, timeout: float) -> bool:
        """Whether the requests the workers sent straight to stubs before :meth:`revoke_all`
        finished within ``timeout`` (the drain waits for them as for the core's own)."""
        draining, self._draining = self._draining, []
        if not draining:
            return True
        _, pending = await asyncio.wait(draining, timeout=timeout)
        return not pending

    def stopped_by(self, worker: int, token: int) -> None:
        """Worker ``worker`` sends no more requests on the routes revocation ``token`` took."""
        waiting = self._stops.get(token)
        if waiting is not None:
            waiting[0].discard(worker)
            if not waiting[0]:
                del self._stops[token]
                if not waiting[1].done():
                    waiting[1].set_result(None)

    def released(self, worker: int, token: int) -> None:
        """Worker ``worker`` has no request left on the routes revocation ``token`` took."""
        waiting = self._waiting.get(token)
        if waiting is None:
            return
        workers, done = waiting
        workers.discard(worker)
        if not workers and not done.done():
            done.set_result(None)
