"""The core's side of one frontend worker's link: answer its calls (``pool.py`` spawns them).

A link is three sockets: ``control`` (blocking request/answer pairs for the core API's
synchronous calls), ``calls`` (inference, streams and model control, multiplexed by id) and
``segments`` (memfd fds both ways: the worker's input arena, ``arenas.py``; the stubs' output
segments it reads, ``outputs.py``). A worker that exits unasked fails only the calls it had in
flight (they are cancelled, which frees their blocks). An inference call costs the core no
task: the service answers it through a callback (:meth:`LinkedCore.start_infer`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from shoal.core.api import CoreAPI
from shoal.core.packed import PackedCall
from shoal.core.types import InferRequest, InferResponse
from shoal.frontends.workers import _plain as plain
from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers.answer_frames import Relayed, RelaySink, send_record, send_response
from shoal.frontends.workers.arenas import LentArena, give_blocks_back, take_blocks
from shoal.frontends.workers.methods import ASYNC_METHODS, DIRECT_METHODS, SYNC_METHODS
from shoal.frontends.workers.outputs import LentOutputs
from shoal.ipc.fdpass import PeerGone
from shoal.ipc.queue import Channel

__all__ = ["Answer", "LinkedCore"]

log = logging.getLogger("shoal")

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

    def start_packed(
        self, call: PackedCall, done: Answer, relay: RelaySink | None = None
    ) -> Callable[[], object] | None:
        """:meth:`start_infer` for a request the worker checked and packed; None: the core did
        not take it (the worker sends it again as a plain call)."""
        ...

    @property
    def direct(self) -> DirectGrants | None:
        """Direct dispatch's routes (None: off)."""
        ...


class InputHolder(Protocol):
    """A stub, as direct dispatch gives it segments of a worker's input arena."""

    announced: set[tuple[int, int]]

    @property
    def pid(self) -> int: ...

    def announce_fd(self, arena_id: int, index: int, size: int, fd: int) -> None: ...


class DirectGrants(Protocol):
    """Direct dispatch's routes, as the core keeps them (``supervisor/direct_routes.py``)."""

    def grant(
        self, worker: int, pid: int, name: str, version: str
    ) -> tuple[list[Any], list[tuple[int, Channel]]] | None: ...

    def released(self, worker: int, token: int) -> None: ...

    def stopped_by(self, worker: int, token: int) -> None: ...

    def counters_fd(self, worker: int) -> int: ...

    def worker_gone(self, worker: int) -> None: ...

    def stub(self, worker: int, pid: int) -> InputHolder | None: ...

    #: Sends a revocation to a worker (the pool sets it).
    tell: Callable[[int, int, list[int]], None] | None
    #: Tells a worker why a stub it sends to died (the pool sets it).
    tell_died: Callable[[int, int, Any], None] | None


class Pool(Protocol):
    """What a link asks of the pool of workers (``pool.WorkerPool``)."""

    def log_settings_changed(
        self, settings: dict[str, Any], origin: _Link, answer: Callable[[], None]
    ) -> None:
        """Tell every worker the log settings now; ``answer`` once the others applied them."""
        ...

    def log_settings_applied(self, index: int, token: int) -> None:
        """Worker ``index`` applied the log settings of update ``token``."""
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


class _PackedReply:
    """:class:`_Reply` for a packed call, whose request is made once the core took it (no
    inputs: nothing to give back but what the work frees)."""

    def __init__(self, link: _Link, call: PackedCall) -> None:
        self._link = link
        self._call = call

    def __call__(self, response: InferResponse | None, error: BaseException | None) -> None:
        self._link._answer(self._call.call_id, self._call.request, response, error)

    def relay(self, model: str, version: str, completion: Relayed) -> None:
        request = self._call.request
        assert request is not None  # relayed only once started, which made it
        self._link.relay(self._call.call_id, request, model, version, completion)


class _Link:
    """One worker process and its sockets, from the core's side."""

    def __init__(self, core: LinkedCore, index: int, pool: Pool) -> None:
        self.core = core
        self.index = index
        self.pool = pool
        #: The worker's input arena, where it places large input tensors.
        self.arena: LentArena | None = None
        #: Responses whose large outputs the worker reads in place.
        self.outputs: LentOutputs | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.pidfd = -1
        #: The core's end of the socket it deals the worker connections on.
        self.deal: socket.socket | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        #: What cancels each call in flight, by id.
        self.calls: dict[int, Callable[[], object]] = {}
        self.outbox: wire.Outbox | None = None
        self.control: asyncio.Transport | None = None
        #: ``arena.lend``, once there is an arena.
        self._lend: wire.Lend | None = None
        #: The traces held for the worker's frontend's timestamps (``wire.TRACED`` sent, no
        #: ``TRACE_STAMPS`` yet): written without them if the worker goes.
        self.held_traces: set[int] = set()

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
        elif kind == wire.DIRECT_RELEASED:
            if (direct := self.core.direct) is not None:
                direct.released(self.index, header[2])
        elif kind == wire.LOG_APPLIED:
            self.pool.log_settings_applied(self.index, call_id)
        elif kind == wire.DIRECT_STOPPED:
            if (direct := self.core.direct) is not None:
                direct.stopped_by(self.index, header[2])
        elif kind == wire.TRACE_STAMPS:
            self._stamps(header[2], header[3])
        elif kind == wire.OK and call_id == 0 and not self.ready.done():
            self.ready.set_result(None)

    def cancel_all(self) -> None:
        """Cancel the calls in flight: their requests fail and free their blocks."""
        calls, self.calls = self.calls, {}
        for cancel in calls.values():
            cancel()
        held, self.held_traces = self.held_traces, set()
        for trace_id in held:  # the worker is gone: its timestamps will not come
            self.core.frontend_trace(trace_id, [])

    def _traced(self, call_id: int, trace_id: int) -> None:
        """Tell the worker, ahead of its answer, that call ``call_id``'s trace awaits its
        frontend's timestamps."""
        outbox = self.outbox
        if outbox is None or outbox.transport.is_closing():  # the worker is gone: none will come
            self.core.frontend_trace(trace_id, [])
            return
        self.held_traces.add(trace_id)
        self.send([wire.TRACED, call_id, trace_id])

    def _stamps(self, trace_id: Any, stamps: Any) -> None:
        """A traced call's frontend timestamps (once: a held trace's)."""
        if isinstance(trace_id, int) and trace_id in self.held_traces:
            self.held_traces.discard(trace_id)
            self.core.frontend_trace(trace_id, wire.stamps_from_wire(stamps))

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

    def on_packed(self, view: memoryview, start: int, payload: int, stop: int) -> None:
        """A request the worker checked, staged and packed (``core/packed.py``): its frame's
        header is ``view[start:payload]``, its packed head the rest up to ``stop``."""
        try:
            call = PackedCall(view, start, payload, view[payload:stop])
        except Exception:  # a worker's bug: nothing in it can be trusted, its call id neither
            log.exception("frontend worker %d sent a packed call the core cannot read", self.index)
            return
        call_id = call.call_id
        self.calls[call_id] = _nothing  # until started: it may be answered before that
        try:
            call.blocks = take_blocks(self.arena, call.numbers)
            reply = _PackedReply(self, call)
            cancel = self.core.start_packed(call, reply, reply)
        except Exception as error:  # a bug: the blocks go back with the error
            give_blocks_back(self.arena, call.blocks, freed=True)
            self._answer(call_id, None, None, error)
            return
        if cancel is None:  # not taken: the worker keeps its blocks and sends it again
            self.calls.pop(call_id, None)
            give_blocks_back(self.arena, call.blocks, freed=False)
            self.send([wire.STALE, call_id, call.stale, call.numbers])
        elif call_id in self.calls:
            self.calls[call_id] = cancel

    def _answer(
        self,
        call_id: int,
        request: InferRequest | None,
        response: InferResponse | None,
        error: BaseException | None,
    ) -> None:
        self.calls.pop(call_id, None)
        if request is not None and request.trace_id > 0:
            self._traced(call_id, request.trace_id)
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
                if self.outbox is not None:  # a worker slower than the model: wait for it
                    await self.outbox.writable()
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
        if request.trace_id > 0:
            self._traced(call_id, request.trace_id)
        send_record(self.send, self.outputs, call_id, (model, version, request.id), done)
        if self.arena is not None:
            self.arena.give_back(request)

    def on_control(self, header: list[Any], payloads: list[memoryview]) -> None:
        method, args = header
        try:
            if method in DIRECT_METHODS:
                answer = [wire.OK, self._direct_call(method, args)]
            elif method not in SYNC_METHODS:
                raise NotImplementedError(f"frontend workers do not forward '{method}'")
            else:
                answer = [wire.OK, plain.to_plain(getattr(self.core, method)(*args))]
        except Exception as error:  # every failure is the caller's answer
            answer = [wire.ERROR, plain.error_to_wire(error)]
        if method == "update_log_settings" and answer[0] == wire.OK:
            # Answered once every worker logs with them (``log_broadcast.py``).
            self.pool.log_settings_changed(answer[1], self, lambda: self._write_control(answer))
        else:
            self._write_control(answer)

    def _write_control(self, answer: list[Any]) -> None:
        if self.control is not None and not self.control.is_closing():
            self.control.write(b"".join(wire.frame(answer)))

    def _direct_call(self, method: str, args: list[Any]) -> Any:
        """A route (its channels' fds sent first on the segment socket), or an output segment
        of a stub lent to the worker (its fd sent, if not yet)."""
        direct, outputs = self.core.direct, self.outputs
        if direct is None or outputs is None:
            return None
        if method == "direct_segment":
            outputs.lend_segment(args[0], args[1])
            return None
        if method == "direct_inputs":
            return self._lend_inputs(direct.stub(self.index, args[0]), args[1])
        pid = -1 if self.proc is None else self.proc.pid
        granted = direct.grant(self.index, pid, args[0], args[1])
        if granted is None:
            return None
        route, channels = granted
        try:
            for stub, channel in channels:
                outputs.send_channel(stub, channel.child_fds())
        finally:
            for _, channel in channels:
                channel.forget()
        return route

    def _lend_inputs(self, stub: InputHolder | None, indices: list[int]) -> bool:
        """Give ``stub`` segments of the worker's input arena (their fds on its socket, before
        the worker writes an Execute that names them); False: the stub has gone."""
        arena = self.arena
        if arena is None or stub is None:
            return False
        try:
            for index in indices:
                if (arena.arena_id, index) not in stub.announced:
                    fd, size = arena.segment_fd(index)
                    stub.announce_fd(arena.arena_id, index, size, fd)
                    log.debug(
                        "frontend worker %d lends input segment %d to stub %d",
                        self.index,
                        index,
                        stub.pid,
                    )
        except (PeerGone, OSError):
            return False
        return True

    def send_free(self, flat: list[int]) -> None:
        self.send([wire.FREE, 0, flat])

    def send_drop(self, arena_id: int, index: int) -> None:
        self.send([wire.DROP, 0, arena_id, index])

    def close(self) -> None:
        if self.deal is not None:
            self.deal.close()  # the connections dealt but not taken close with it
        if self.outbox is not None:
            self.outbox.transport.close()
        if self.control is not None:
            self.control.close()
        if self.outputs is not None:
            self.outputs.close()
        if self.arena is not None:
            self.arena.worker_exited()  # its blocks still in use come back later
