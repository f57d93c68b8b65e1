"""Direct dispatch, a frontend worker's side: plain requests written straight into the stubs.

The core grants a worker a route to a plain model version (``supervisor/direct_routes.py``):
a channel to each of its stubs. A request the worker packed (``packing.py``) which asks for
no timeout then goes as its own Execute into the ring of the stub with the fewest of this
worker's requests, and the stub's Result comes back on that channel: the core does nothing per
request (docs/decisions.md, "Direct dispatch"). Inputs too large to travel inline lie in blocks
of the worker's arena: the core gives the stub each segment once (``direct_inputs``), and the
worker frees the blocks when the Result comes. The worker makes the response (inline outputs;
outputs in the stub's arena read in place, their blocks given back on the same ring once
written), counts the request's statistics in shared memory before it answers
(``ipc/stat_counters.py``: the core adds them up when read), and on a client that went away
sends the stub a Cancel.

Anything else takes the core's way: a request that does not fit, a full ring, a route the core
refused or took back (:meth:`DirectDispatch.revoke`: the worker answers once its requests on it
are done). A stub that exits is seen on its pidfd: what this worker had sent it fails
(UNAVAILABLE) and the route is dropped, to be asked for again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final

from shoal.core.errors import InternalError, InvalidArgument, Unavailable
from shoal.core.types import InferOutput, InferRequest, InferResponse
from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers.direct_records import (
    Answer,
    direct_fits,
    execute_payload,
    model_error,
    output_blocks,
    pin_outputs,
    private_inputs,
    whole_response,
)
from shoal.frontends.workers.direct_stubs import (
    InputArena,
    Route,
    Stub,
    Waiting,
    least_busy,
    monotonic_ns,
    split_routes,
)
from shoal.frontends.workers.packing import Prepared
from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.peer_segments import AnnouncedSegments
from shoal.ipc.queue import Channel
from shoal.ipc.stat_counters import BACKEND, CANCELED, OTHER, SUCCESS, CounterRows, Tally
from shoal.ipc.tensor import InlineBytes
from shoal.ipc.whole_results import OneWhole, read_one, read_record

__all__ = ["DirectDispatch", "Route", "direct_fits"]

#: How long a worker waits for the core's words on a stub's exit before it uses its own.
EXIT_WORDS_S: Final = 1.0
#: How long a worker trusts that a version has no route before it asks again.
RETRY_S: Final = 2.0
#: Routes kept at most (a client naming many versions fills none past it).
MAX_ROUTES: Final = 1024
#: Worker batch ids and request keys: its origin above this bit, apart from the core's and others'.
ORIGIN_SHIFT: Final = 40


class DirectDispatch:
    """The worker's routes, its channels to stubs, and the statistics it owes the core."""

    def __init__(
        self,
        worker: int,
        call: Callable[..., Any],
        segments: AnnouncedSegments,
        send: Callable[[list[Any]], None],
        inputs: InputArena,
        counters: int,
    ) -> None:
        """``call(method, *args)``: a synchronous call of the core (``direct_route``, for a
        route; ``direct_segment``, for a stub's output segment's fd; ``direct_inputs``, to
        give a stub segments of the worker's input arena); ``send``: a frame to it;
        ``inputs``: the worker's input arena; ``counters``: the fd of its segment of
        statistics counters."""
        self._worker = worker
        self._inputs = inputs
        self._origin = (worker + 1) << ORIGIN_SHIFT
        self._call = call
        self._segments = segments
        self._send = send
        self._routes: dict[tuple[str, str], Route | float] = {}
        self._stubs: dict[int, Stub] = {}
        self._ids = itertools.count(1)
        #: The statistics of the requests answered, written before their responses.
        self._tally = Tally(CounterRows(counters))
        #: The worker's loop, known once a stub is adopted (before any request goes to one):
        #: ``get_running_loop`` costs a ``getpid`` call per request on Python 3.11.
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- routes ------------------------------------------------------------------------------

    def route(self, name: str, version: str) -> Route | None:
        """The route for ``(name, version)``; None: send the request the core's way."""
        key = (name, version)
        kept = self._routes.get(key)
        if isinstance(kept, Route):
            return kept
        now = time.monotonic()
        if kept is not None and now < kept:
            return None
        route = self._granted(self._call("direct_route", name, version))
        if len(self._routes) >= MAX_ROUTES:
            self._routes.clear()
        self._routes[key] = now + RETRY_S if route is None else route
        return route

    def _granted(self, plain: list[Any] | None) -> Route | None:
        if plain is None:
            return None
        slot, generation, label, entries, row = plain
        stubs = []
        for pid, fresh, name in entries:
            stub = self._stubs.get(pid)
            if stub is None or fresh:
                stub = self._adopt(pid, name, self._segments.channel_fds(pid), stub)
            if stub.dead:
                return None
            stubs.append(stub)
        return Route(slot, generation, label, stubs, self._worker, row)

    def _adopt(self, pid: int, name: str, fds: list[int], old: Stub | None) -> Stub:
        """Our end of a new channel to stub ``pid``, watched on the loop with the stub's exit."""
        if old is not None:
            self._forget(old, Unavailable("the stub's channel was replaced"))
        try:
            pidfd: int | None = os.pidfd_open(pid)
        except OSError:  # it has exited already (or the kernel has no pidfds)
            pidfd = None
        stub = Stub(pid, name, Channel.adopt(fds), pidfd)
        self._stubs[pid] = stub
        loop = self._loop = asyncio.get_running_loop()
        stub.channel.watch_up(loop, lambda: self._read(stub))
        if pidfd is not None:
            loop.add_reader(pidfd, self._exited, stub)
        else:
            stub.dead = True
        return stub

    def revoke(self, token: int, slots: list[int]) -> None:
        """The core takes the routes of ``slots`` back: no new request goes on them (the core
        hears so at once) and the core hears once those in flight are done."""
        self._routes, taken = split_routes(self._routes, lambda route: route.slot in slots)
        self._send([wire.DIRECT_STOPPED, 0, token])
        waiting = False
        for route in taken:
            if route.in_flight:
                route.revoked.append(token)
                waiting = True
        if not waiting:
            self._send([wire.DIRECT_RELEASED, 0, token])

    # -- requests ----------------------------------------------------------------------------

    def submit(
        self, request: InferRequest, prepared: Prepared, started_ns: int
    ) -> Coroutine[Any, Any, InferResponse] | None:
        """``request`` (packed: ``prepared``; its ``staged``: the block of each input in the
        worker's arena, None where it is inline) sent to one of its route's stubs: returns the
        coroutine that awaits its Result and makes its response; None when it takes the core's
        way: no route, one for another generation of the model than it was packed for, a full
        ring, no live stub (it goes staged as it is). Not a coroutine itself: the caller
        returns the one it gets to its own caller's ``await`` (``RemoteCore.infer``), as each
        level of ``await`` costs every request on its way in and again when it resumes."""
        route = self.route(request.model_name, request.model_version)
        if route is None or prepared.generation != route.generation:
            return None
        staged = prepared.staged
        stub = least_busy(route.stubs, route.turn)
        route.turn += 1
        if stub is None:
            return None
        inputs = [block for block in staged if block is not None]
        if inputs and not self._lent(stub, inputs):
            return None
        batch = self._origin | next(self._ids)
        payload = execute_payload(batch, prepared.head, private_inputs(staged) if inputs else 0)
        try:
            if not stub.channel.send_down_nowait(payload):
                return None
        except Exception:  # the stub is gone
            return None
        loop = self._loop
        assert loop is not None  # set when the stub was adopted
        future: asyncio.Future[Answer] = loop.create_future()
        stub.pending[batch] = Waiting(future, route, started_ns, inputs)
        return self._answer(stub, route, batch, request, inputs, future)

    async def _answer(
        self,
        stub: Stub,
        route: Route,
        batch: int,
        request: InferRequest,
        inputs: list[Block],
        future: asyncio.Future[Answer],
    ) -> InferResponse:
        """The response to ``request``, sent as ``batch``, once its Result comes (a client
        that goes away: the stub hears a Cancel)."""
        route.in_flight += 1  # from the first step: awaited at once by whoever submitted it
        try:
            result = await future
        except asyncio.CancelledError:
            self._cancel(stub, batch, future, inputs)
            raise
        finally:
            route.in_flight -= 1
            if route.revoked and not route.in_flight:
                self._answer_revoked(route)
        return self._response(stub, route, request, result, inputs)

    def _lent(self, stub: Stub, inputs: list[Block]) -> bool:
        """The stub has the segments of the worker's arena these blocks lie in: the core
        sends it those it lacks (their fds on its socket) before this returns, so before any
        Execute that names them. False: the core could not (the stub is gone)."""
        missing = {block.segment for block in inputs} - stub.segments
        if not missing:
            return True
        try:
            lent = bool(self._call("direct_inputs", stub.pid, sorted(missing)))
        except Exception:  # the core refused (the stub is going) or is gone
            return False
        if lent:
            stub.segments |= missing
        return lent

    def segment_retired(self, index: int) -> None:
        """The worker retired an empty segment of its arena (the core tells the stubs)."""
        for stub in self._stubs.values():
            stub.segments.discard(index)

    def _cancel(
        self, stub: Stub, batch: int, got: asyncio.Future[Answer], inputs: list[Block]
    ) -> None:
        """The client went away: the model sees it (``is_cancelled``), and its Result, when it
        comes, only gives its blocks back: now, if it came in the cancel's turn (``got``)."""
        if got.done() and not got.cancelled() and got.exception() is None:
            self._done(stub, output_blocks(got.result()), inputs)
        elif not stub.dead:
            with contextlib.suppress(Exception):
                stub.channel.send_down_nowait(msg.encode(msg.Cancel([batch])))

    def _answer_revoked(self, route: Route) -> None:
        tokens, route.revoked = route.revoked, []
        for token in tokens:
            self._send([wire.DIRECT_RELEASED, 0, token])

    def _read(self, stub: Stub) -> list[tuple[Waiting, Answer, bool]]:
        """Results waiting on ``stub``'s channel: statistics counted (and written, before any
        response is written), each to the request waiting for it; returns them."""
        results: list[tuple[Waiting, Answer, bool]] = []
        while (payload := stub.channel.recv_up_nowait()) is not None:
            message: Answer | None = read_one(payload)  # nearly every answer: read at once
            if message is None:
                decoded = msg.decode(payload)
                if type(decoded) is not msg.Result:
                    continue
                message = decoded
            waiting = stub.pending.pop(message.batch_id, None)
            if waiting is None:
                continue
            cancelled = waiting.future.done()  # asked once: the loop cannot run until below
            self._count(waiting, message, cancelled)
            results.append((waiting, message, cancelled))
        self._tally.publish()
        for waiting, result, cancelled in results:
            if cancelled:  # the client went away meanwhile
                self._done(stub, output_blocks(result), waiting.inputs)
            else:
                waiting.future.set_result(result)
        return results

    def _count(self, waiting: Waiting, result: Answer, cancelled: bool) -> None:
        if type(result) is OneWhole:  # a success, run by the model
            outcome, executed, stub_ns, compute = SUCCESS, 1, result.stub_ns, result.compute_ns
        else:
            assert type(result) is msg.Result
            executed, stub_ns, compute = int(result.executed), result.stub_ns, result.compute_ns
            responses = result.responses
            ok = result.wholes is not None or (bool(responses) and responses[0].error is None)
            outcome = SUCCESS if ok else BACKEND if executed else OTHER
        if cancelled:  # the client went away (Triton counts it CANCELED)
            outcome = CANCELED
        start = stub_ns[0]
        queue_ns = max(0, start - waiting.sent_ns) if start else 0
        self._counted(waiting, outcome, executed, queue_ns, compute)

    def _counted(
        self,
        waiting: Waiting,
        outcome: int,
        executed: int,
        queue_ns: int = 0,
        compute: tuple[int, int, int] = (0, 0, 0),
    ) -> None:
        route = waiting.route
        total_ns = monotonic_ns() - waiting.started_ns
        self._tally.count(
            route.row, route.generation, outcome, executed, total_ns, queue_ns, compute
        )

    def _response(
        self,
        stub: Stub,
        route: Route,
        request: InferRequest,
        result: Answer,
        inputs: list[Block],
    ) -> InferResponse:
        """The response to ``request``; its output blocks (and ``inputs``, which an output may
        be: a model that answers with its input as it is) are given back once it is written."""
        blocks = output_blocks(result)
        release = (lambda: self._done(stub, blocks, inputs)) if blocks else None
        try:
            response = self._made(stub, route, request, result, release)
        except BaseException:
            self._done(stub, blocks, inputs)
            raise
        if release is None and inputs:
            self._inputs.free_blocks(inputs)
        return response

    def _made(
        self,
        stub: Stub,
        route: Route,
        request: InferRequest,
        result: Answer,
        release: Callable[[], None] | None,
    ) -> InferResponse:
        if type(result) is OneWhole:  # every output inline (``ipc/whole_results.py``)
            return whole_response(request, route.label, result.outputs, None, {})
        assert type(result) is msg.Result
        if result.wholes is not None:  # (a record MessagePack reads)
            outputs, error, parameters = read_record(result.wholes[0])
            return whole_response(request, route.label, outputs, error, parameters)
        if result.rescheduled:  # only a model of an iterative sequence may (the core's words)
            raise InvalidArgument(
                "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the "
                f"model of instance '{stub.name}' does not support rescheduling: it needs "
                "sequence_batching { iterative_sequence: true }"
            )
        if not result.responses:
            raise Unavailable(f"model '{request.model_name}': the request was not run")
        record = result.responses[0]
        if record.error is not None:
            raise model_error(record.error)
        tensors = [
            InferOutput(o.name, o.datatype, tuple(o.shape), self._bytes(o.location), {})
            for o in record.outputs
        ]
        return InferResponse(
            request.model_name, route.label, request.id, tensors, record.parameters, release
        )

    def _bytes(self, location: object) -> memoryview:
        """An output's bytes: inline, or read in place in its stub's arena."""
        if isinstance(location, InlineBytes):
            return memoryview(location.data)
        if isinstance(location, Block):
            if location.arena_id == self._inputs.arena_id:  # an input, answered as it is
                return self._inputs.view(location)
            if not self._segments.has(location.arena_id, location.segment):
                self._call("direct_segment", location.arena_id, location.segment)
            return self._segments.view(location)
        raise InternalError(
            "a model's output is in GPU memory, which a frontend worker cannot read directly"
        )

    def _done(self, stub: Stub, blocks: list[Block], inputs: list[Block]) -> None:
        """A response written (or not to be): its output blocks go back to the stub, but for
        those in the worker's own arena, which are inputs: those go back to it."""
        own = self._inputs.arena_id
        self._give_back(stub, [block for block in blocks if block.arena_id != own])
        if inputs:
            self._inputs.free_blocks(inputs)

    def _give_back(self, stub: Stub, blocks: list[Block]) -> None:
        """Output blocks written (or not needed): the stub's arena may reuse them."""
        if blocks and not stub.dead:
            with contextlib.suppress(Exception):
                stub.channel.send_down_nowait(msg.encode(msg.Release(blocks)))

    # -- stubs that exit -----------------------------------------------------------------------

    def stub_died(self, pid: int, why: BaseException) -> None:
        """The core saw stub ``pid`` exit: what waits for it fails with the core's words."""
        stub = self._stubs.get(pid)
        if stub is not None:
            self._forget(stub, why)

    def _exited(self, stub: Stub) -> None:
        """The stub's pidfd says it exited: nothing more goes to it; what waits for it fails
        with the core's words (:meth:`stub_died`) or, if they do not come soon, these."""
        stub.dead = True
        loop = asyncio.get_running_loop()
        if stub.pidfd is not None:
            loop.remove_reader(stub.pidfd)
        why = Unavailable(f"the stub process serving this request (pid {stub.pid}) exited")
        loop.call_later(EXIT_WORDS_S, self._forget, stub, why)

    def _forget(self, stub: Stub, why: BaseException) -> None:
        """``stub`` is gone: fail what waits for it, drop the routes through it."""
        if self._stubs.get(stub.pid) is not stub:
            return  # forgotten already
        stub.dead = True
        loop = asyncio.get_running_loop()
        if stub.pidfd is not None:
            loop.remove_reader(stub.pidfd)
            os.close(stub.pidfd)
            stub.pidfd = None
        self._stubs.pop(stub.pid, None)
        with contextlib.suppress(Exception):  # a ring that does not read: what waits fails
            for _, result, cancelled in self._read(stub):  # what it wrote whole is answered,
                if not cancelled:  # its outputs copied: the core has its arena dropped next
                    pin_outputs(result, self._inputs.arena_id, self._bytes)
        pending, stub.pending = stub.pending, {}
        for waiting in pending.values():
            if waiting.inputs:
                self._inputs.free_blocks(waiting.inputs)
            self._counted(waiting, OTHER, 0)
            if not waiting.future.done():
                waiting.future.set_exception(why)
        self._tally.publish()
        self._routes = split_routes(self._routes, lambda route: stub in route.stubs)[0]
        stub.channel.close()

    def close(self) -> None:
        for stub in list(self._stubs.values()):
            self._forget(stub, Unavailable("the frontend worker is stopping"))
