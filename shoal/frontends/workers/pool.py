"""The frontend worker processes, from the core's side: spawn them, restart the dead, stop them.

Each worker is a process started with ``command`` plus the sockets of its link (``host.py``)
and the socket the core deals it connections on: the core accepts on the ``listening`` sockets
and hands each connection to the next worker that serves (``dealing.py``). A worker that exits
unasked fails only the calls it had in flight and is started again; a worker finds out that the
core died from its sockets closing (and its parent-death signal), so the core's death takes
every worker with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shoal.core.api import ArenaRegistry
from shoal.frontends.workers import _plain as plain
from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers.arenas import LentArena
from shoal.frontends.workers.dealing import ConnectionDealer, deal_socketpair
from shoal.frontends.workers.host import LinkedCore, _Link
from shoal.frontends.workers.log_broadcast import LogBroadcasts
from shoal.frontends.workers.outputs import LentOutputs

__all__ = ["WorkerPool"]

log = logging.getLogger("shoal")

#: Restart delays for a worker that keeps dying: doubled up to the last, reset after a minute up.
_BACKOFF = (0.2, 5.0)
_STABLE_SECS = 60.0

#: Ids of the workers' input arenas: above every stub's output arena id, and never reused (a
#: restarted worker's arena is a new one, which no stub can mistake for the old).
_arena_ids = itertools.count(1 << 32)


class WorkerPool:
    """``count`` frontend worker processes serving ``core``."""

    def __init__(
        self,
        core: LinkedCore,
        count: int,
        command: Sequence[str],
        listening: Mapping[bytes, socket.socket],
        hello: bytes,
        arenas: ArenaRegistry | None = None,
    ) -> None:
        self._core = core
        #: Where the workers' input arenas are announced (None: inputs travel inline).
        self._arenas = arenas
        self._count = count
        self._command = list(command)
        #: Deals the connections of the ``listening`` sockets (it closes them when it stops).
        self._dealer = ConnectionDealer(listening, self._outlets) if listening else None
        self._hello = hello
        self._links: list[_Link | None] = [None] * count
        self._stopping = False
        self._restarts: set[asyncio.Task[None]] = set()
        #: When each worker was last started, and the delay of its last restart.
        self._started: dict[int, float] = {}
        self._delays: dict[int, float] = {}
        #: Other sockets to close once the workers have stopped (a port held for grpcio's).
        self.sockets: list[socket.socket] = []
        #: Changes of the log settings waiting for the workers to apply them.
        self._log_updates = LogBroadcasts()
        if (direct := core.direct) is not None:
            direct.tell = self._tell_revoke
            direct.tell_died = self._tell_stub_died

    @property
    def pids(self) -> list[int]:
        return [link.proc.pid for link in self._links if link is not None and link.proc is not None]

    async def start(self, timeout: float = 60.0) -> None:
        """Start every worker and wait until each serves its sockets."""
        links = [await self._spawn(i) for i in range(self._count)]
        await self._wait_ready(links, timeout)
        if self._dealer is not None:
            self._dealer.start()

    def _outlets(self) -> list[socket.socket | None]:
        """Each worker's dealing socket while it serves (None while it starts, once it died)."""
        return [
            link.deal if link is not None and link.ready.done() and not link.exited.done() else None
            for link in self._links
        ]

    async def _wait_ready(self, links: list[_Link], timeout: float) -> None:
        for link in links:
            waits: list[asyncio.Future[Any]] = [link.ready, link.exited]
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not link.ready.done():
                why = (
                    f"exited with status {link.exited.result()}"
                    if link.exited.done()
                    else (f"did not start within {timeout:.0f}s")
                )
                raise RuntimeError(f"frontend worker {link.index} {why}")

    async def _spawn(self, index: int) -> _Link:
        loop = asyncio.get_running_loop()
        link = _Link(self._core, index, self)
        self._started[index] = loop.time()
        control, control_child = socket.socketpair()
        calls, calls_child = socket.socketpair()
        segments, segments_child = socket.socketpair()
        link.deal, deal_child = deal_socketpair()
        arena_id = next(_arena_ids) if self._arenas is not None else -1
        # The same segment of statistics counters for every start of this worker: its counts
        # outlive it (``direct_counters.py``).
        direct = self._core.direct
        counters = -1 if direct is None else direct.counters_fd(index)
        try:
            argv = [
                *self._command,
                "--control",
                str(control_child.fileno()),
                "--calls",
                str(calls_child.fileno()),
                "--segments",
                str(segments_child.fileno()),
                "--arena",
                str(arena_id),
                "--parent",
                str(os.getpid()),
                "--index",
                str(index),
                "--counters",
                str(counters),
                "--deal",
                str(deal_child.fileno()),
            ]
            link.proc = subprocess.Popen(
                argv,
                pass_fds=[
                    control_child.fileno(),
                    calls_child.fileno(),
                    segments_child.fileno(),
                    deal_child.fileno(),
                    *([] if counters < 0 else [counters]),
                ],
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a terminal's ^C goes to the core, which stops workers
            )
        except BaseException:
            segments.close()
            raise
        finally:
            control_child.close()
            calls_child.close()
            segments_child.close()
            deal_child.close()
        if self._arenas is not None:
            link.arena = LentArena(arena_id, segments, self._arenas, link.send_free)
            link.outputs = LentOutputs(segments, self._arenas, arena_id, link.send_drop)
        else:
            segments.close()
        link.pidfd = os.pidfd_open(link.proc.pid)
        loop.add_reader(link.pidfd, self._reap, link)
        control.sendall(b"".join(wire.frame(["hello", self._hello])))
        calls_reader = wire.FrameReader(link.on_call, link.cancel_all, link.on_packed)
        await loop.connect_accepted_socket(lambda: calls_reader, sock=calls)
        assert calls_reader.transport is not None
        link.outbox = wire.Outbox(calls_reader.transport)
        control_reader = wire.FrameReader(link.on_control, lambda: None)
        await loop.connect_accepted_socket(lambda: control_reader, sock=control)
        link.control = control_reader.transport
        self._links[index] = link
        # A worker started after a change of the log settings starts with them too.
        link.send([wire.LOG_SETTINGS, 0, self._core.log_settings()])
        return link

    def log_settings_changed(
        self, settings: dict[str, Any], origin: _Link, answer: Callable[[], None]
    ) -> None:
        """Tell every worker the log settings now; ``answer`` the update taken through
        ``origin`` once the others have applied them (``log_broadcast.py``)."""
        live = [link for link in self._links if link is not None and not link.exited.done()]
        token = self._log_updates.start(origin.index, [link.index for link in live], answer)
        for link in live:
            link.send([wire.LOG_SETTINGS, token, settings])

    def log_settings_applied(self, index: int, token: int) -> None:
        """Worker ``index`` applied the log settings of update ``token``."""
        self._log_updates.applied(index, token)

    def _tell_revoke(self, index: int, token: int, slots: list[int]) -> None:
        """Ask worker ``index`` to give direct routes back (``direct_routes.revoke``)."""
        link = self._links[index]
        if link is not None and not link.exited.done():
            link.send([wire.DIRECT_REVOKE, 0, token, slots])
        elif (direct := self._core.direct) is not None:
            direct.released(index, token)

    def _tell_stub_died(self, index: int, pid: int, error: BaseException) -> None:
        """Tell worker ``index`` why stub ``pid``, which it sends to directly, died."""
        link = self._links[index]
        if link is not None and not link.exited.done():
            link.send([wire.DIRECT_STUB_GONE, 0, pid, plain.error_to_wire(error)])

    def _reap(self, link: _Link) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(link.pidfd)
        os.close(link.pidfd)
        link.pidfd = -1
        assert link.proc is not None
        status = link.proc.wait()
        link.cancel_all()
        link.close()
        if (direct := self._core.direct) is not None:
            direct.worker_gone(link.index)
        self._log_updates.gone(link.index)
        if not link.exited.done():
            link.exited.set_result(status)
        if self._stopping:
            return
        why = f"signal {signal.Signals(-status).name}" if status < 0 else f"status {status}"
        log.warning(
            "frontend worker %d (pid %d) exited with %s; restarting it",
            link.index,
            link.proc.pid,
            why,
        )
        task = asyncio.create_task(self._restart(link.index))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        last = self._started.get(index, 0.0)
        # A worker that keeps dying at once is restarted more and more slowly.
        if loop.time() - last > _STABLE_SECS:
            delay = _BACKOFF[0]
        else:
            delay = min(self._delays.get(index, _BACKOFF[0] / 2) * 2, _BACKOFF[1])
        self._delays[index] = delay
        await asyncio.sleep(delay)
        if self._stopping:
            return
        try:
            link = await self._spawn(index)
            await self._wait_ready([link], 60.0)
        except (OSError, RuntimeError) as error:
            log.error("frontend worker %d could not be restarted: %s", index, error)

    async def stop(self, grace: float) -> None:
        """Ask every worker to stop (finishing what it serves within ``grace``), then kill the
        ones still running."""
        self._stopping = True
        if self._dealer is not None:
            self._dealer.stop()  # new connections are refused from now on
        for task in list(self._restarts):
            task.cancel()
        links = [link for link in self._links if link is not None and not link.exited.done()]
        for link in links:
            link.send([wire.STOP, 0, grace])
        if links:
            await asyncio.wait([link.exited for link in links], timeout=grace + 5.0)
        for link in links:
            if not link.exited.done() and link.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    link.proc.kill()
        if links:
            await asyncio.wait([link.exited for link in links], timeout=5.0)
        for last in self._links:
            if last is None:
                continue
            last.cancel_all()
            last.close()
        for sock in self.sockets:
            sock.close()
