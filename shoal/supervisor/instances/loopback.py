"""The loopback kind of stub: in the supervisor's process, answering with a Python function.

A :class:`LoopbackStub` speaks the same messages as a stub process, encoded and decoded as on the
rings, and maps the input arena's segments from the fds it is given, as a stub does; only the
model is a function of one request's input arrays. It lets the instances, the repository manager
and the service be tested without starting a process. :class:`Loopback` is the kind: pass it
where a ``make_stub`` is taken (``build_service``, ``ModelLoader``, ``StubInstance``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from shoal.ipc import messages as msg
from shoal.ipc.arena import ArenaMap, Block, OwnedArena, Segment
from shoal.ipc.dtypes import numpy_to_datatype
from shoal.ipc.queue import PeerGone
from shoal.ipc.tensor import (
    INLINE_REQUEST_MAX,
    INLINE_TENSOR_MAX,
    InlineBytes,
    Location,
    TensorDesc,
    buffer_to_numpy,
    numpy_to_buffer_size,
    write_numpy,
)
from shoal.supervisor.instances.channel import Tensors
from shoal.supervisor.instances.process import StubLaunch


@dataclass(frozen=True)
class Call:
    """What a loopback model returns to call another model (BLS, ``InferenceRequest.exec()``):
    its request is answered with that model's outputs, or its error."""

    model: str
    inputs: dict[str, np.ndarray]


#: One request's inputs to its outputs (or a :class:`Call`). Raising answers that request with
#: the error; returning None never answers the batch (a model that hangs).
LoopbackModel = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray] | Call | None]

#: Pids no process has (above Linux's largest pid_max), one per loopback stub.
_pids = itertools.count(1 << 23)


class LoopbackStub:
    """One in-process stub (the loopback kind of ``StubChannel``)."""

    def __init__(
        self,
        launch: StubLaunch,
        output_arena_id: int,
        model: LoopbackModel,
        inline_outputs: bool = False,
    ) -> None:
        self.launch, self.output_arena_id, self.pid = launch, output_arena_id, next(_pids)
        #: Small outputs travel inside the Result, as a real stub sends them; off, every output
        #: takes a block (what tests of the blocks' lifetimes look at).
        self.inline_outputs = inline_outputs
        self.returncode: int | None = None
        self._loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[int] = self._loop.create_future()
        self.announced: set[tuple[int, int]] = set()
        self.cuda_chunks: set[tuple[int, int]] = set()
        self.spawned = False
        self.executions = 0  # batches the model ran, for tests to look at
        self.received: list[msg.Message] = []  # and the messages it received
        self._model = model
        self._outputs = OwnedArena(
            output_arena_id, initial_bytes=1 << 20, growth_bytes=1 << 20, limit_bytes=1 << 26
        )
        self._inputs = ArenaMap()
        self._up: deque[bytes] = deque()
        self._ready: Callable[[], object] | None = None
        self._on_exit: Callable[[int], None] | None = None
        self._calls: dict[int, _PendingCall] = {}
        self._call_ids = itertools.count(1)

    # -- the StubChannel side ----------------------------------------------------------------

    def spawn(self, loop: asyncio.AbstractEventLoop, on_exit: Callable[[int], None]) -> None:
        self.spawned = True
        self._on_exit = on_exit

    def watch_up(self, loop: asyncio.AbstractEventLoop, ready: Callable[[], object]) -> None:
        self._ready = ready

    def recv_up_nowait(self) -> bytes | None:
        return self._up.popleft() if self._up else None

    def send(self, message: msg.Message, ring: bool = True) -> bool:
        if self.returncode is not None:
            raise PeerGone("the loopback stub has exited")
        encoded = msg.encode(message)
        if len(encoded) > self.launch.ring_bytes - 8:  # a ring record's length word
            raise ValueError(f"message of {len(encoded)} bytes exceeds the ring capacity")
        self._receive(msg.decode(encoded))  # the wire form, as on a ring
        return True

    async def send_async(self, message: msg.Message) -> None:
        self.send(message)

    def wake(self) -> None:
        """Nothing sleeps here: ``send`` delivers at once."""

    def announce(self, segment: Segment) -> None:
        assert segment.fd is not None
        self._map(segment.arena_id, segment.index, segment.fd, segment.size)

    def forward(self, locations: Sequence[Location], tensors: Tensors) -> None:
        for location in locations:
            if type(location) is not Block:
                continue
            key = (location.arena_id, location.segment)
            if location.arena_id != self.output_arena_id and key not in self.announced:
                fd, size = tensors.fd(*key)
                self._map(location.arena_id, location.segment, fd, size)

    def output_view(self, block: Block) -> memoryview:
        return self._outputs.view(block).toreadonly()

    def mapped_segment(self, arena_id: int, index: int) -> Segment:
        return self._outputs.segment(index)

    def segment_fd(self, arena_id: int, index: int) -> tuple[int, int]:
        segment = self._outputs.segment(index)
        assert segment.fd is not None
        return segment.fd, segment.size

    def drop_output_segment(self, index: int) -> None:
        pass  # the loopback's arena is the supervisor's own mapping

    def kill(self) -> None:
        self._loop.call_soon(self._exit, -9)

    def terminate(self) -> None:
        self._loop.call_soon(self._exit, -15)

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        self._inputs.close()
        self._outputs.close()

    # -- the stub side -----------------------------------------------------------------------

    def output_block(self, nbytes: int) -> Block:
        """A block of its output arena, as a response of the model would hold one."""
        return self._outputs.allocate(nbytes)

    @property
    def output_bytes_in_use(self) -> int:
        """Output blocks the supervisor has not released yet."""
        return self._outputs.used_bytes

    def _map(self, arena_id: int, index: int, fd: int, size: int) -> None:
        self._inputs.add_fd(arena_id, index, os.dup(fd), size)
        self.announced.add((arena_id, index))

    def _receive(self, message: msg.Message) -> None:
        self.received.append(message)
        match message:
            case msg.Initialize():
                self._reply(msg.Ready())
            case msg.Execute(batch_id=batch_id, requests=requests):
                self._execute(batch_id, requests)
            case msg.Release(blocks=blocks):
                for block in blocks:
                    self._outputs.free(block)
            case msg.Finalize():
                self._reply(msg.Finalized())
                self._loop.call_soon(self._exit, 0)
            case msg.BlsReply(call_id=call_id, response=response):
                self._called(call_id, response)

    def _execute(self, batch_id: int, requests: list[msg.RequestRecord]) -> None:
        batch = _Batch(batch_id, time.monotonic_ns(), [None] * len(requests))
        for index, request in enumerate(requests):
            answer = self._run(request)
            if answer is None:
                return  # the model hangs: no Result
            if isinstance(answer, Call):
                self._call(batch, index, answer)
            else:
                batch.responses[index] = answer
        self._finish(batch)

    def _run(self, request: msg.RequestRecord) -> msg.ResponseRecord | Call | None:
        inputs = {t.name: self._array(t) for t in request.inputs}
        try:
            outputs = self._model(inputs)
        except Exception as error:
            return msg.ResponseRecord(error=("INTERNAL", f"{type(error).__name__}: {error}"))
        if outputs is None or isinstance(outputs, Call):
            return outputs
        wanted = request.requested_outputs or list(outputs)
        room = INLINE_REQUEST_MAX if self.inline_outputs else 0
        tensors = []
        for name in wanted:
            tensor = self._output(name, outputs[name], room)
            if type(tensor.location) is InlineBytes:
                room -= tensor.location.nbytes
            tensors.append(tensor)
        return msg.ResponseRecord(tensors)

    def _finish(self, batch: _Batch) -> None:
        """Send the batch's Result once every request has its response."""
        if any(response is None for response in batch.responses):
            return
        self.executions += 1
        responses = [r for r in batch.responses if r is not None]
        stub_ns = (batch.started_ns, time.monotonic_ns())
        self._reply(msg.Result(batch.batch_id, responses, stub_ns=stub_ns))

    def _call(self, batch: _Batch, index: int, call: Call) -> None:
        """A BLS call: its inputs go in this stub's output arena, as a stub puts them."""
        tensors = [self._output(name, array) for name, array in call.inputs.items()]
        call_id = next(self._call_ids)
        self._calls[call_id] = _PendingCall(batch, index, tensors)
        request = msg.RequestRecord("", 0, 0, {}, [], tensors)
        self._reply(msg.BlsCall(call_id, call.model, -1, request, False))

    def _called(self, call_id: int, response: msg.ResponseRecord | None) -> None:
        pending = self._calls.pop(call_id)
        for tensor in pending.inputs:
            assert isinstance(tensor.location, Block)
            self._outputs.free(tensor.location)
        if response is None or response.error is not None:
            answer = msg.ResponseRecord(error=response.error if response else ("INTERNAL", ""))
        else:
            answer = msg.ResponseRecord([self._copy(t) for t in response.outputs])
        self._reply(msg.BlsDone(call_id))  # the called model's outputs are copied: release them
        pending.batch.responses[pending.index] = answer
        self._finish(pending.batch)

    def _copy(self, tensor: TensorDesc) -> TensorDesc:
        return self._output(tensor.name, self._array(tensor))

    def _array(self, tensor: TensorDesc) -> np.ndarray:
        block = tensor.location
        if isinstance(block, InlineBytes):  # bytes the Execute carried
            view = memoryview(block.data)
        else:
            assert isinstance(block, Block)
            view = self._inputs.view(block) if block.nbytes else memoryview(b"")
        return np.array(buffer_to_numpy(tensor.datatype, tensor.shape, view))

    def _output(self, name: str, array: np.ndarray, inline_room: int = 0) -> TensorDesc:
        datatype = numpy_to_datatype(array.dtype)
        nbytes = numpy_to_buffer_size(array, datatype)
        if nbytes <= inline_room and nbytes <= INLINE_TENSOR_MAX:
            data = bytearray(nbytes)
            write_numpy(array, datatype, memoryview(data))
            return TensorDesc(name, datatype, tuple(array.shape), InlineBytes(bytes(data)))
        block = self._outputs.allocate(nbytes)
        write_numpy(array, datatype, self._outputs.view(block))
        return TensorDesc(name, datatype, tuple(array.shape), block)

    def _reply(self, message: msg.Message) -> None:
        self._up.append(msg.encode(message))
        if self._ready is not None:
            self._loop.call_soon(self._deliver)

    def _deliver(self) -> None:
        if self._ready is not None and self._ready() is False and self._up:
            self._loop.call_soon(self._deliver)  # it read its share: the rest next turn

    def _exit(self, returncode: int) -> None:
        if self.returncode is not None:
            return
        self.returncode = returncode
        self.exited.set_result(returncode)
        if self._on_exit is not None:
            self._on_exit(returncode)


@dataclass(eq=False)
class _Batch:
    batch_id: int
    started_ns: int
    responses: list[msg.ResponseRecord | None]


@dataclass(eq=False)
class _PendingCall:
    batch: _Batch
    index: int
    inputs: list[TensorDesc] = field(default_factory=list)


class Loopback:
    """The loopback kind: makes a :class:`LoopbackStub` per instance, its model chosen by
    instance name, and keeps every stub it made (the last one per instance in ``latest``)."""

    def __init__(
        self, model_of: Callable[[str], LoopbackModel], *, inline_outputs: bool = False
    ) -> None:
        self._model_of = model_of
        self._inline_outputs = inline_outputs
        self.made: list[LoopbackStub] = []
        self.latest: dict[str, LoopbackStub] = {}

    def __call__(self, launch: StubLaunch, output_arena_id: int) -> LoopbackStub:
        model = self._model_of(launch.instance_name)
        stub = LoopbackStub(launch, output_arena_id, model, self._inline_outputs)
        self.made.append(stub)
        self.latest[launch.instance_name] = stub
        return stub
