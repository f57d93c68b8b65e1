"""The core relays a stub's response record to a worker: the same answers, field for field and
byte for byte, as the response the core made before, with every block given back.

Two worker links serve one service over loopback stubs: one as the core runs it (the relay),
one whose core is asked without a relay (every answer made as an ``InferResponse``). The same
calls go through both and the responses the worker decodes from their answer frames are
compared whole (a relayed answer has a frame of its own, ``_response_wire.relayed_from_wire``).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from shoal._serve_parser import build_parser
from shoal.cli import options_from_args
from shoal.core import InferInput, InferRequest, RequestedOutput
from shoal.frontends.workers import _response_wire as response_wire
from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers.arenas import INLINE_MAX
from shoal.frontends.workers.host import _Link
from shoal.frontends.workers.outputs import LentOutputs, MappedOutputs
from shoal.frontends.workers.pool import WorkerPool
from shoal.ipc.tensor import INLINE_TENSOR_MAX
from shoal.supervisor.compose import build_service
from shoal.supervisor.instances.loopback import Loopback
from shoal.supervisor.service import InferenceService

pytestmark = pytest.mark.timeout(30)

CONFIG = """
name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [
  { name: "Y" data_type: TYPE_UINT8 dims: [ -1 ] },
  { name: "S" data_type: TYPE_STRING dims: [ 1 ] }
]
"""


def echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    x = inputs["X"]
    if x.size == 0:
        raise ValueError("an empty input")
    return {"Y": x ^ 1, "S": np.array([b"n=%d" % x.size], dtype=object)}


class _WithoutRelay:
    """The service, asked as a core without the relay: every answer a response."""

    def __init__(self, service: InferenceService) -> None:
        self._service = service

    def start_infer(self, request: InferRequest, done: Any, relay: Any = None) -> Any:
        return self._service.start_infer(request, done)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)


class _Counted:
    """A call's relay, counted."""

    def __init__(self, relay: Any, counts: list[str]) -> None:
        self._relay = relay
        self._counts = counts

    def relay(self, model: str, version: str, completion: Any) -> None:
        self._counts.append(model)
        self._relay.relay(model, version, completion)


class _Counting(_WithoutRelay):
    """The service, with the relays it was given counted when they are used."""

    def __init__(self, service: InferenceService) -> None:
        super().__init__(service)
        self.relayed: list[str] = []

    def start_infer(self, request: InferRequest, done: Any, relay: Any = None) -> Any:
        return self._service.start_infer(request, done, _Counted(relay, self.relayed))


class _Socket(asyncio.Transport):
    """The worker's end of a link: the answer frames the core writes, by call id."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[int, bytes] = {}
        self.arrived = asyncio.Event()
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def writelines(self, pieces: Any) -> None:
        data = b"".join(pieces)
        at = 0
        while at < len(data):
            header, payload = wire.prefix(data, at)
            stop = at + wire.PREFIX_SIZE + header + payload
            fields, _ = wire.split(
                data[at + wire.PREFIX_SIZE : at + wire.PREFIX_SIZE + header], b""
            )
            self.answers[fields[1]] = data[at:stop]
            at = stop
        self.arrived.set()


def _kind(frame: bytes) -> int:
    header, _ = wire.prefix(frame)
    fields, _ = wire.split(frame[wire.PREFIX_SIZE : wire.PREFIX_SIZE + header], b"")
    return int(fields[0])


def _answer(frame: bytes) -> Any:
    """What the worker reads from an answer frame: the response's every field, or the error."""
    fields, payloads = _fields(frame)
    if fields[0] != wire.OK:
        return fields
    response = response_wire.response_from_wire(fields[2:], payloads)
    outputs = [(o.name, o.datatype, o.shape, o.parameters, bytes(o.data)) for o in response.outputs]
    return (
        fields[1],
        response.model_name,
        response.model_version,
        response.id,
        outputs,
        response.parameters,
        response.final,
        response.error,
    )


def _link(core: Any) -> tuple[_Link, _Socket]:
    pool = WorkerPool(core, 0, [], {}, b"")
    link = _Link(core, 0, pool)
    end = _Socket()
    link.outbox = wire.Outbox(end)
    return link, end


def _call(call_id: int, request: InferRequest) -> tuple[list[Any], list[memoryview]]:
    payloads: list[memoryview | bytes] = []
    fields = wire.request_to_wire(request, payloads)
    return [wire.CALL, call_id, "infer", fields], [memoryview(p) for p in payloads]


def _requests() -> list[InferRequest]:
    sizes = [16, INLINE_TENSOR_MAX - 1, INLINE_TENSOR_MAX, INLINE_TENSOR_MAX + 1, INLINE_MAX]
    sizes += [INLINE_MAX + 1, 0]  # 0: the model fails it
    requests = []
    for size in sizes:
        data = os.urandom(size)
        requests.append(
            InferRequest("echo", id=f"r{size}", inputs=[InferInput("X", "UINT8", (size,), data)])
        )
    only_y = InferRequest(
        "echo", inputs=[InferInput("X", "UINT8", (3,), b"abc")], outputs=[RequestedOutput("Y")]
    )
    classified = InferRequest(
        "echo",
        inputs=[InferInput("X", "UINT8", (3,), b"abc")],
        outputs=[RequestedOutput("Y", {"classification": 2})],
    )
    return [*requests, only_y, classified]


async def _answers(link: _Link, end: _Socket, requests: list[InferRequest]) -> dict[int, bytes]:
    for call_id, request in enumerate(requests, 1):
        link.on_call(*_call(call_id, request))
    while len(end.answers) < len(requests):
        end.arrived.clear()
        await asyncio.wait_for(end.arrived.wait(), 5)
    return end.answers


def _on_service(tmp_path, scenario: Callable[[InferenceService, Loopback], Any]) -> None:
    model = tmp_path / "echo"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    args = build_parser().parse_args(["serve", "--model-repository", str(tmp_path)])
    kind = Loopback(lambda name: echo, inline_outputs=True)
    service = build_service(options_from_args(args), make_stub=kind)

    async def run() -> None:
        await service.load_repository()
        try:
            await scenario(service, kind)
        finally:
            await service.shutdown(1.0)

    asyncio.run(run())


def test_relayed_answers_are_the_frames_the_core_made_from_responses(tmp_path):
    async def scenario(service: InferenceService, kind: Loopback) -> None:
        requests = _requests()
        counting = _Counting(service)
        relayed = await _answers(*_link(counting), requests)
        made = await _answers(*_link(_WithoutRelay(service)), requests)
        assert sorted(relayed) == sorted(made)
        assert [_answer(relayed[i]) for i in relayed] == [_answer(made[i]) for i in relayed]
        # A relayed frame is its own kind: the layout's bytes where a response has its model.
        assert type(_fields(relayed[1])[0][2]) is bytes
        assert type(_fields(made[1])[0][2]) is str
        # Relayed: all but the error and the classification (which the core makes itself).
        assert counting.relayed == ["echo"] * (len(requests) - 2)
        assert [_kind(frame) for frame in relayed.values()].count(wire.ERROR) == 1
        assert b"an empty input" in relayed[7]
        await asyncio.sleep(0)  # releases reach the stub once per loop turn
        assert kind.latest["echo_0"].output_bytes_in_use == 0
        assert service.input_arena.used_bytes == 0
        (stats,) = service.model_statistics("echo")
        assert stats.inference_count == 2 * (len(requests) - 1)

    _on_service(tmp_path, scenario)


def _lend(link: _Link, service: InferenceService) -> tuple[MappedOutputs, list[socket.socket]]:
    """Give ``link`` a worker that maps the stubs' output segments."""
    core_end, worker_end = socket.socketpair()
    link.outputs = LentOutputs(core_end, service.directory, 1 << 32, link.send_drop)
    return MappedOutputs(worker_end, None), [core_end, worker_end]


def _fields(frame: bytes) -> tuple[list[Any], list[memoryview]]:
    header, _ = wire.prefix(frame)
    start = wire.PREFIX_SIZE + header
    return wire.split(frame[wire.PREFIX_SIZE : start], memoryview(frame)[start:])


def test_a_large_output_relayed_is_read_in_place_until_the_worker_releases_it(tmp_path):
    data = os.urandom(INLINE_MAX + 8)
    request = InferRequest("echo", inputs=[InferInput("X", "UINT8", (len(data),), data)])
    expected = bytes(np.frombuffer(data, np.uint8) ^ 1)

    async def scenario(service: InferenceService, kind: Loopback) -> None:
        stub = kind.latest["echo_0"]
        counting = _Counting(service)
        relay, relay_end = _link(counting)
        made, made_end = _link(_WithoutRelay(service))
        mapped, sockets = _lend(relay, service)
        other, more = _lend(made, service)
        try:
            relayed = (await _answers(relay, relay_end, [request]))[1]
            fields, payloads = _fields(relayed)
            same, same_payloads = _fields((await _answers(made, made_end, [request]))[1])
            assert counting.relayed == ["echo"]
            # The same answer but where the block lies (the first is still held).
            response = response_wire.response_from_wire(fields[2:], payloads, mapped.view)
            made_response = response_wire.response_from_wire(same[2:], same_payloads, other.view)
            where, _ = fields[5]
            assert where is not None and where[2] != same[5][0][4][2]
            assert [(o.name, o.datatype, o.shape, bytes(o.data)) for o in response.outputs] == [
                (o.name, o.datatype, o.shape, bytes(o.data)) for o in made_response.outputs
            ]
            del made_response  # (its views of the mapped segment, before it closes)
            y, s = response.outputs
            assert bytes(y.data) == expected  # read in the stub's arena, not in the frame
            text = b"n=%d" % len(data)
            assert len(payloads) == 1 and bytes(s.data) == len(text).to_bytes(4, "little") + text
            del response, y, s
            held = stub.output_bytes_in_use
            assert held > 0
            relay.on_call([wire.RELEASE, 0, fields[-1]], [])
            await asyncio.sleep(0)
            assert stub.output_bytes_in_use < held  # the relayed one went back
            made.close()  # a worker that died holding its answer: its blocks go back
            relay.on_call(*_call(2, request))  # answered, then the worker dies unreleased
            while 2 not in relay_end.answers:
                await asyncio.wait_for(relay_end.arrived.wait(), 5)
                relay_end.arrived.clear()
            relay.cancel_all()
            relay.close()
            await asyncio.sleep(0)
            assert stub.output_bytes_in_use == 0
            assert service.input_arena.used_bytes == 0
        finally:
            mapped.close()
            other.close()
            for sock in sockets + more:
                sock.close()

    _on_service(tmp_path, scenario)
