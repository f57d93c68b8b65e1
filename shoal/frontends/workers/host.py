"""The core's side of the frontend workers: spawn them, answer their calls, restart the dead.

Each worker is a process started with ``command`` plus the three sockets of its link: ``control``
(blocking request/answer pairs for the core API's synchronous calls), ``calls`` (inference,
streams and model control, multiplexed by id) and ``segments`` (memfd fds both ways: the
worker's input arena, ``arenas.py``; the stubs' output segments it reads, ``outputs.py``). The
listening sockets in ``inherit`` are passed
down, so every worker accepts on the same ports. A worker that exits unasked fails only the
calls it had in flight (they are cancelled, which frees their blocks) and is started again; a
worker finds out that the core died from its sockets closing (and its parent-death signal), so
the core's death takes every worker with it. An inference call costs the core no task: the
service answers it through a callback (:meth:`LinkedCore.start_infer`).
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
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from shoal.core.api import ArenaRegistry, CoreAPI
from shoal.core.types import InferRequest, InferResponse
from shoal.frontends.workers import _plain as plain
from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers.answer_frames import Relayed, RelaySink, send_record, send_response
from shoal.frontends.workers.arenas import LentArena
from shoal.frontends.workers.client import ASYNC_METHODS, SYNC_METHODS
from shoal.frontends.workers.outputs import LentOutputs

__all__ = ["WorkerPool"]

log = logging.getLogger("shoal")

#: Restart delays for a worker that keeps dying: doubled up to the last, reset after a minute up.
_BACKOFF = (0.2, 5.0)
_STABLE_SECS = 60.0

#: Ids of the workers' input arenas: above every stub's output arena id, and never reused (a
#: restarted worker's arena is a new one, which no stub can mistake for the old).
_arena_ids = itertools.count(1 << 32)

#: Called once with (response, None) or (None, the error; CancelledError when cancelled).
Answer = Callable[[InferResponse | None, BaseException | None], None]


class LinkedCore(CoreAPI, Protocol):
    """The core the workers serve: the API, and inference answered through a callback."""

    def start_infer(
        self, request: InferRequest, done: Answer, relay: RelaySink | None = None
    ) -> Callable[[], object]:
        """Start ``request``; ``done`` answers it once (maybe before this returns), or ``relay``
        with the stub's record; the function returned cancels it. No task per request: the
        core's CPU per request counts most."""
        ...


def _nothing() -> None:
    pass


class _Reply:
    """Answers one inference call of a link (the ``done`` of ``start_infer``): one object per
    call, where a closure was two (its cell environment and the function)."""

    def __init__(self, link: _Link, call_id: int, request: InferRequest) -> None:
        self._link = link
        self._call_id = call_id
        self._request = request

    def __call__(self, response: InferResponse | None, error: BaseException | None) -> None:
        self._link._answer(self._call_id, self._request, response, error)

    def relay(self, model: str, version: str, completion: Relayed) -> None:
        self._link.relay(self._call_id, self._request, model, version, completion)


class _Link:
    """One worker process and its sockets, from the core's side."""

    def __init__(self, core: LinkedCore, index: int, pool: WorkerPool) -> None:
        self.core = core
        self.index = index
        self.pool = pool
        #: The worker's input arena, where it places large input tensors.
        self.arena: LentArena | None = None
        #: Responses whose large outputs the worker reads in place.
        self.outputs: LentOutputs | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.pidfd = -1
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        #: What cancels each call in flight, by id.
        self.calls: dict[int, Callable[[], object]] = {}
        self.outbox: wire.Outbox | None = None
        self.control: asyncio.Transport | None = None
        #: ``arena.lend``, once there is an arena.
        self._lend: wire.Lend | None = None

    def send(self, header: list[Any], payloads: Sequence[memoryview | bytes] = ()) -> None:
        """Queue a frame; its bytes are copied first, so blocks may be released right after."""
        outbox = self.outbox
        if outbox is not None and not outbox.transport.is_closing():
            outbox.put(wire.frame(header, payloads), copy=True)

    def on_call(self, header: list[Any], payloads: list[memoryview]) -> None:
        # [kind, call id, *fields], read in place: no list of the fields per call
        kind = header[0]
        call_id = header[1]
        if kind == wire.CALL:
            method, args = header[2], header[3]
            if method == "infer":
                self._infer(call_id, args, payloads)
            else:
                task = asyncio.create_task(self._run(call_id, method, args, payloads))
                self.calls[call_id] = task.cancel
        elif kind == wire.CANCEL:
            cancel = self.calls.pop(call_id, None)
            if cancel is not None:
                cancel()
        elif kind == wire.RELEASE:
            if self.outputs is not None:
                self.outputs.release(header[2])
        elif kind == wire.RETIRED:
            if self.arena is not None:
                self.arena.retired(header[2])
        elif kind == wire.OK and call_id == 0 and not self.ready.done():
            self.ready.set_result(None)

    def cancel_all(self) -> None:
        """Cancel the calls in flight: their requests fail and free their blocks."""
        calls, self.calls = self.calls, {}
        for cancel in calls.values():
            cancel()

    def _infer(self, call_id: int, args: list[Any], payloads: list[memoryview]) -> None:
        self.calls[call_id] = _nothing  # until started: it may be answered before that
        lend = self._lend
        if lend is None and self.arena is not None:  # its bound method made once, not per call
            lend = self._lend = self.arena.lend
        try:
            request = wire.request_from_wire(args, payloads, lend)
        except Exception as error:  # every failure is the caller's answer
            self._answer(call_id, None, None, error)
            return
        try:
            reply = _Reply(self, call_id, request)
            cancel = self.core.start_infer(request, reply, reply)
        except Exception as error:
            self._answer(call_id, request, None, error)
            return
        if call_id in self.calls:
            self.calls[call_id] = cancel

    def _answer(
        self,
        call_id: int,
        request: InferRequest | None,
        response: InferResponse | None,
        error: BaseException | None,
    ) -> None:
        self.calls.pop(call_id, None)
        if response is not None:
            try:
                self.answer(wire.OK, call_id, response)
            except Exception as failure:  # every failure is the caller's answer
                error = failure
        if error is not None and not isinstance(error, asyncio.CancelledError):
            self.send([wire.ERROR, call_id, plain.error_to_wire(error)])
        if request is not None and self.arena is not None:
            self.arena.give_back(request)

    async def _run(
        self, call_id: int, method: str, args: list[Any], payloads: list[memoryview]
    ) -> None:
        request: InferRequest | None = None
        lend = None if self.arena is None else self.arena.lend
        try:
            if method == "infer_stream":
                request = wire.request_from_wire(args, payloads, lend)
                await self._forward(call_id, request)
            elif method in ASYNC_METHODS:
                result = await getattr(self.core, method)(*args)
                self.send([wire.OK, call_id, plain.to_plain(result)])
            else:
                raise NotImplementedError(f"frontend workers do not forward '{method}'")
        except asyncio.CancelledError:
            pass  # the worker gave up on the call (or died): nobody waits for an answer
        except Exception as error:  # every failure is the caller's answer
            self.send([wire.ERROR, call_id, plain.error_to_wire(error)])
        finally:
            self.calls.pop(call_id, None)
            if request is not None and self.arena is not None:
                self.arena.give_back(request)

    async def _forward(self, call_id: int, request: InferRequest) -> None:
        """Send every response of a stream, then its end."""
        stream = self.core.infer_stream(request)
        failure: BaseException | None = None
        try:
            async for response in stream:
                self.answer(wire.ITEM, call_id, response)
        except BaseException as error:
            failure = error
        # Closed after the try, not in a finally: mypyc compiles this module, and a compiled
        # coroutine that awaits in a finally re-raises the last exception handled before it
        # (every stream after a failed one ended with that failure; test_compiled.py).
        await stream.aclose()  # type: ignore[attr-defined]
        if failure is not None:
            raise failure
        self.send([wire.END, call_id])

    def answer(self, kind: int, call_id: int, response: InferResponse) -> None:
        """Send a response (``answer_frames.send_response``)."""
        send_response(self.send, self.outputs, kind, call_id, response)

    def relay(
        self, call_id: int, request: InferRequest, model: str, version: str, done: Relayed
    ) -> None:
        """Answer a call from the stub's response record (the core's relay)."""
        self.calls.pop(call_id, None)
        send_record(self.send, self.outputs, call_id, (model, version, request.id), done)
        if self.arena is not None:
            self.arena.give_back(request)

    def on_control(self, header: list[Any], payloads: list[memoryview]) -> None:
        method, args = header
        try:
            if method not in SYNC_METHODS:
                raise NotImplementedError(f"frontend workers do not forward '{method}'")
            answer = [wire.OK, plain.to_plain(getattr(self.core, method)(*args))]
        except Exception as error:  # every failure is the caller's answer
            answer = [wire.ERROR, plain.error_to_wire(error)]
        if self.control is not None and not self.control.is_closing():
            self.control.write(b"".join(wire.frame(answer)))
        if method == "update_log_settings" and answer[0] == wire.OK:
            self.pool.send_log_settings(answer[1], but=self)

    def send_free(self, flat: list[int]) -> None:
        self.send([wire.FREE, 0, flat])

    def send_drop(self, arena_id: int, index: int) -> None:
        self.send([wire.DROP, 0, arena_id, index])

    def close(self) -> None:
        if self.outbox is not None:
            self.outbox.transport.close()
        if self.control is not None:
            self.control.close()
        if self.outputs is not None:
            self.outputs.close()
        if self.arena is not None:
            self.arena.worker_exited()  # its blocks still in use come back later


class WorkerPool:
    """``count`` frontend worker processes serving ``core``."""

    def __init__(
        self,
        core: LinkedCore,
        count: int,
        command: Sequence[str],
        inherit: Sequence[int],
        hello: bytes,
        arenas: ArenaRegistry | None = None,
    ) -> None:
        self._core = core
        #: Where the workers' input arenas are announced (None: inputs travel inline).
        self._arenas = arenas
        self._count = count
        self._command = list(command)
        self._inherit = list(inherit)
        self._hello = hello
        self._links: list[_Link | None] = [None] * count
        self._stopping = False
        self._restarts: set[asyncio.Task[None]] = set()
        #: When each worker was last started, and the delay of its last restart.
        self._started: dict[int, float] = {}
        self._delays: dict[int, float] = {}
        #: The listening sockets the workers serve, closed once they have stopped.
        self.sockets: list[socket.socket] = []

    @property
    def pids(self) -> list[int]:
        return [link.proc.pid for link in self._links if link is not None and link.proc is not None]

    async def start(self, timeout: float = 60.0) -> None:
        """Start every worker and wait until each serves its sockets."""
        links = [await self._spawn(i) for i in range(self._count)]
        await self._wait_ready(links, timeout)

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
        arena_id = next(_arena_ids) if self._arenas is not None else -1
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
            ]
            link.proc = subprocess.Popen(
                argv,
                pass_fds=[
                    control_child.fileno(),
                    calls_child.fileno(),
                    segments_child.fileno(),
                    *self._inherit,
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
        if self._arenas is not None:
            link.arena = LentArena(arena_id, segments, self._arenas, link.send_free)
            link.outputs = LentOutputs(segments, self._arenas, arena_id, link.send_drop)
        else:
            segments.close()
        link.pidfd = os.pidfd_open(link.proc.pid)
        loop.add_reader(link.pidfd, self._reap, link)
        control.sendall(b"".join(wire.frame(["hello", self._hello])))
        calls_reader = wire.FrameReader(link.on_call, link.cancel_all)
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

    def send_log_settings(self, settings: dict[str, Any], but: _Link | None = None) -> None:
        """Tell every worker (``but`` the one that changed them) the log settings now."""
        for link in self._links:
            if link is not None and link is not but:
                link.send([wire.LOG_SETTINGS, 0, settings])

    def _reap(self, link: _Link) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(link.pidfd)
        os.close(link.pidfd)
        link.pidfd = -1
        assert link.proc is not None
        status = link.proc.wait()
        link.cancel_all()
        link.close()
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
