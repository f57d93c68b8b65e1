"""Trace timestamps through a frontend worker's link: the request says its frontend will send
them (a field, a packed call's flag), the core names a traced call's trace before answering it
(``wire.TRACED``), the worker sends them one way (``wire.TRACE_STAMPS``), and a worker gone
lets its held traces be written without them."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from shoal.core.packed import TRACED, PackedCall, encode, frame
from shoal.core.types import InferRequest, InferResponse
from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers._response_wire import response_to_wire
from shoal.frontends.workers.client import RemoteCore, recv_frame
from shoal.frontends.workers.host import _Link
from shoal.frontends.workers.pool import WorkerPool

pytestmark = pytest.mark.timeout(20)


def _request(trace_id: int) -> InferRequest:
    request = InferRequest("m", "", "r", [], [], {})
    request.trace_id = trace_id
    return request


@pytest.mark.parametrize(("sent", "read"), [(-1, -1), (0, 0), (7, 0)])
def test_a_request_crosses_with_its_frontend_s_promise_of_timestamps(sent, read):
    """-1 crosses (the core holds a sampled trace for it); an id never does: the core gives
    those."""
    fields = wire.request_to_wire(_request(sent), [])
    header, _ = wire.split(*_parts(wire.frame([wire.CALL, 1, "infer", fields])))
    assert wire.request_from_wire(header[3], []).trace_id == read


def _parts(pieces: list[Any]) -> tuple[memoryview, memoryview]:
    data = b"".join(bytes(p) for p in pieces)
    size, payload = wire.prefix(data)
    view = memoryview(data)[wire.PREFIX_SIZE :]
    return view[:size], view[size : size + payload]


@pytest.mark.parametrize("flags", [0, TRACED])
def test_a_packed_call_carries_the_flag(flags):
    encoded = encode(7, 1, "r", 1, 0, 0, [])
    assert encoded is not None
    data = b"".join(frame(3, encoded, b"h", flags))
    size, _ = wire.prefix(data)
    call = PackedCall(data, wire.PREFIX_SIZE, wire.PREFIX_SIZE + size, b"h")
    assert (call.call_id, call.traced) == (3, bool(flags))


def test_only_well_formed_stamps_are_taken():
    stamps = [["HTTP_RECV_START", 5], ['X","ns":1}]', 6], ["A", "7"], ["B"], "C", ["D", 8]]
    assert wire.stamps_from_wire(stamps) == [("HTTP_RECV_START", 5), ("D", 8)]
    assert wire.stamps_from_wire({"a": 1}) == []


class _Core:
    """The core's side the link calls: traces every request asking for it (id 40 + call)."""

    direct = None

    def __init__(self) -> None:
        self.stamps: list[tuple[int, list[tuple[str, int]]]] = []

    def start_infer(self, request: InferRequest, done: Any, relay: Any = None) -> Any:
        if request.trace_id < 0:
            request.trace_id = 40 + int(request.id)
        done(InferResponse("m", "1", request.id), None)
        return lambda: None

    def frontend_trace(self, trace_id: int, timestamps: list[tuple[str, int]]) -> None:
        self.stamps.append((trace_id, timestamps))


class _Frames(asyncio.Transport):
    """The worker's end of a link: every frame the core writes, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[list[Any]] = []
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def writelines(self, pieces: Any) -> None:
        data = b"".join(bytes(p) for p in pieces)
        while data:
            size, payload = wire.prefix(data)
            self.headers.append(wire.split(*_parts([data]))[0])
            data = data[wire.PREFIX_SIZE + size + payload :]


def test_the_core_names_a_traced_call_s_trace_before_answering_it():
    async def run() -> None:
        core = _Core()
        link = _Link(core, 0, WorkerPool(core, 0, [], {}, b""))  # type: ignore[arg-type]
        end = _Frames()
        link.outbox = wire.Outbox(end)
        for call_id, trace_id in ((1, -1), (2, 0), (3, -1)):
            fields = wire.request_to_wire(_request(trace_id), [])
            fields[2] = str(call_id)
            link.on_call([wire.CALL, call_id, "infer", fields], [])
        await asyncio.sleep(0)  # one turn: the outbox writes what the turn queued
        kinds = [(h[0], h[1]) for h in end.headers]
        traced, ok = wire.TRACED, wire.OK  # TRACED right before the answer of a traced call
        assert kinds == [(traced, 1), (ok, 1), (ok, 2), (traced, 3), (ok, 3)]
        assert [end.headers[0][2], end.headers[3][2]] == [41, 43]
        link.on_call([wire.TRACE_STAMPS, 0, 41, [["HTTP_RECV_START", 9]]], [])
        link.on_call([wire.TRACE_STAMPS, 0, 41, [["HTTP_RECV_START", 9]]], [])  # once
        link.on_call([wire.TRACE_STAMPS, 0, 99, []], [])  # never held: ignored
        assert core.stamps == [(41, [("HTTP_RECV_START", 9)])]
        end.closed = True  # the worker died: 43's stamps will never come
        link.cancel_all()
        assert core.stamps[1:] == [(43, [])]
        fields = wire.request_to_wire(_request(-1), [])
        fields[2] = "4"
        link.on_call([wire.CALL, 4, "infer", fields], [])  # answered after: written at once
        assert core.stamps[2:] == [(44, [])] and link.held_traces == set()

    asyncio.run(run())


def test_the_worker_reads_its_trace_id_and_sends_its_stamps_one_way():
    control, control_peer = socket.socketpair()
    calls, core_end = socket.socketpair()
    core_end.settimeout(5)
    remote = RemoteCore(control)

    async def run() -> None:
        await remote.connect(calls)
        loop = asyncio.get_running_loop()
        for trace_id in (-1, 0):
            request = _request(trace_id)
            answered = asyncio.ensure_future(remote._infer(request, None))
            header, _ = await loop.run_in_executor(None, recv_frame, core_end)
            assert header[3][-1] == trace_id  # the promise crossed with the call
            call_id = header[1]
            answer = [wire.OK, call_id, *response_to_wire(InferResponse("m", "1", "r"), [])]
            if trace_id < 0:
                core_end.sendall(b"".join(wire.frame([wire.TRACED, call_id, 41])))
            core_end.sendall(b"".join(wire.frame(answer)))
            await answered
            assert request.trace_id == (41 if trace_id < 0 else 0)
        remote.frontend_trace(41, [("HTTP_SEND_END", 12)])
        (kind, _, trace_id, stamps), _ = await loop.run_in_executor(None, recv_frame, core_end)
        assert (kind, trace_id, stamps) == (wire.TRACE_STAMPS, 41, [["HTTP_SEND_END", 12]])
        core_end.sendall(b"".join(wire.frame([wire.TRACED, 77, 42])))  # nobody waits for 77
        (kind, _, trace_id, stamps), _ = await loop.run_in_executor(None, recv_frame, core_end)
        assert (kind, trace_id, stamps) == (wire.TRACE_STAMPS, 42, [])
        assert remote._traced == {}

    try:
        asyncio.run(run())
    finally:
        for sock in (control, control_peer, calls, core_end):
            sock.close()
