"""Memory pressure: small shared-memory arenas and the HTTP body limit.

The server runs with arenas of 1 MiB that grow by 1 MiB up to 8 MiB (Triton's
``--backend-config python,shm-*`` knobs, which shoal applies to its input arena and to each stub's
output arena) and ``--http-max-input-size`` of 16 MiB, so a request can be small enough for HTTP
and still too large for the arena. What must hold:

* a request larger than the arena fails alone, with 503 / RESOURCE_EXHAUSTED and a message that
  states the requested and available bytes; the next request succeeds;
* many concurrent near-limit requests each succeed or fail cleanly (503 with that message), none
  hangs, and afterwards the input arena is empty again (``shoal_arena_used_bytes``) and a
  full-size request fits again;
* a body over ``--http-max-input-size`` is refused with 400 before it is read: the answer comes
  while the client has sent almost nothing of what it announced, and other clients go on;
* after bursts of small requests have grown an arena in small segments, a tensor of the whole
  limit still fits once the arena is empty (empty segments are retired), and no process keeps
  a retired segment mapped (``/proc/<pid>/maps`` and ``/proc/<pid>/fd``).
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import re
import select
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.http1 import read_head_and_body
from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
ARENA_LIMIT = 8 * MIB
MAX_INPUT = 16 * MIB
ARENA_ARGS = (
    "--backend-config",
    "python,shm-default-byte-size=1048576",
    "--backend-config",
    "python,shm-growth-byte-size=1048576",
    "--backend-config",
    f"python,shm-limit-byte-size={ARENA_LIMIT}",
)
SERVER_ARGS = (*ARENA_ARGS, "--http-max-input-size", str(MAX_INPUT))
#: No answer within this many seconds counts as a hang.
CLIENT_TIMEOUT = 30.0
#: The largest tensor that fits beside the arena's first segment (shm-default-byte-size) without
#: retiring it (a block cannot span segments). An empty arena takes up to ARENA_LIMIT, by
#: retiring every segment: test_arena_fragmented_by_small_requests_refuses_large_ones.
FULL_SIZE = ARENA_LIMIT - MIB

EXHAUSTED = re.compile(
    r"shared-memory arena \d+ cannot allocate (\d+) bytes: (\d+) bytes available "
    r"\(the largest block it can hold now\) of a (\d+)-byte limit"
)
SEGMENT = re.compile(r"memfd:shoal-arena-(\d+)-(\d+)")


@pytest.fixture(scope="module")
def server():
    with ShoalServer(BUNDLED, extra_args=SERVER_ARGS, metrics=True) as srv:
        stubs = srv.stub_pids()
        yield srv
        assert srv.stub_pids() == stubs, "a stub died under memory pressure"


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


# --- helpers ------------------------------------------------------------------------------------


def _post(
    server: ShoalServer, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, bytes, int | None]:
    """(status, body, Inference-Header-Content-Length of the answer if any)."""
    host, port = server.url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=CLIENT_TIMEOUT)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        reply = conn.getresponse()
        header_length = reply.getheader("Inference-Header-Content-Length")
        return reply.status, reply.read(), int(header_length) if header_length else None
    finally:
        conn.close()


def identity_request(server: ShoalServer, nbytes: int, **extra) -> tuple[int, bytes]:
    """A UINT8 tensor of ``nbytes`` through the identity model (binary in, binary out)."""
    document = {
        "inputs": [
            {
                "name": "IN_UINT8",
                "datatype": "UINT8",
                "shape": [nbytes],
                "parameters": {"binary_data_size": nbytes},
            }
        ],
        "parameters": {"binary_data_output": True},
        **extra,
    }
    header = json.dumps(document).encode()
    payload = bytes([nbytes % 251]) * nbytes
    status, body, json_size = _post(
        server,
        "/v2/models/identity/infer",
        header + payload,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    if status == 200:
        assert json_size is not None
        assert json.loads(body[:json_size])["outputs"][0]["shape"] == [nbytes]
        assert body[json_size:] == payload
    return status, body


def upper_request(server: ShoalServer, nbytes: int) -> tuple[int, bytes]:
    """One BYTES element of ``nbytes`` through string_upper: its output needs as much room in
    the stub's output arena as its input in the input arena."""
    text = b"a" * (nbytes - 4)
    payload = struct.pack("<I", len(text)) + text
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "TEXT",
                    "datatype": "BYTES",
                    "shape": [1, 1],
                    "parameters": {"binary_data_size": len(payload)},
                }
            ],
            "outputs": [{"name": "LENGTH", "parameters": {"binary_data": False}}],
        }
    ).encode()
    status, body, _ = _post(
        server,
        "/v2/models/string_upper/infer",
        header + payload,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    if status == 200:
        assert json.loads(body)["outputs"][0]["data"] == [len(text)]
    return status, body


def upper_text_request(server: ShoalServer, nbytes: int) -> int:
    """Like upper_request, but the upper-cased text comes back (binary): the output takes
    ``nbytes`` in string_upper's output arena."""
    text = b"a" * (nbytes - 4)
    payload = struct.pack("<I", len(text)) + text
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "TEXT",
                    "datatype": "BYTES",
                    "shape": [1, 1],
                    "parameters": {"binary_data_size": len(payload)},
                }
            ],
            "outputs": [{"name": "UPPER", "parameters": {"binary_data": True}}],
        }
    ).encode()
    status, body, json_size = _post(
        server,
        "/v2/models/string_upper/infer",
        header + payload,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    if status == 200:
        assert json_size is not None
        assert body[json_size:] == struct.pack("<I", len(text)) + text.upper()
    return status


def add_sub_works(server: ShoalServer) -> None:
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
                {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1, 1, 1, 1]},
            ]
        }
    ).encode()
    status, answer, _ = _post(server, "/v2/models/add_sub/infer", body)
    assert status == 200, answer
    assert json.loads(answer)["outputs"][0]["data"] == [2, 3, 4, 5]


def arena(server: ShoalServer) -> tuple[int, int]:
    """(used, capacity) bytes of the input arena, from /metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=CLIENT_TIMEOUT)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    values = {}
    for line in text.splitlines():
        for gauge in ("shoal_arena_used_bytes", "shoal_arena_capacity_bytes"):
            if line.startswith(gauge + '{arena="input"}'):
                values[gauge] = int(float(line.split()[-1]))
    return values["shoal_arena_used_bytes"], values["shoal_arena_capacity_bytes"]


def wait_arena_empty(server: ShoalServer) -> None:
    deadline = time.monotonic() + 10
    while (used := arena(server)[0]) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the gauge: blocks come back as results arrive
    assert used == 0, f"{used} bytes of the input arena were never given back"


def assert_exhausted(status: int, body: bytes, requested: int | None = None) -> None:
    """503 whose message states the requested and available bytes and the limit."""
    assert status == 503, body
    message = json.loads(body)["error"]
    match = EXHAUSTED.search(message)
    assert match, message
    asked, available, limit = (int(g) for g in match.groups())
    assert asked >= (requested or 1) and available < asked and limit == ARENA_LIMIT, message
    assert "shm-limit-byte-size" in message  # it says which knob to raise


# --- the arena limit ----------------------------------------------------------------------------


def test_request_over_the_arena_limit_fails_alone(server, stub):
    add_sub_works(server)
    too_big = ARENA_LIMIT + MIB
    status, body = identity_request(server, too_big)
    assert_exhausted(status, body, too_big)
    assert f"cannot allocate {too_big} bytes" in json.loads(body)["error"]
    assert "'identity'" in json.loads(body)["error"]
    # The same over gRPC: RESOURCE_EXHAUSTED with the same message.
    request = service_pb2.ModelInferRequest(model_name="identity")
    request.inputs.add(name="IN_UINT8", datatype="UINT8", shape=[too_big])
    request.raw_input_contents.append(bytes(too_big))
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=CLIENT_TIMEOUT)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert EXHAUSTED.search(info.value.details()), info.value.details()
    # Nothing is held: the next requests succeed, a full-size one included.
    add_sub_works(server)
    assert identity_request(server, FULL_SIZE)[0] == 200
    assert upper_request(server, FULL_SIZE)[0] == 200
    wait_arena_empty(server)


def test_concurrent_near_limit_requests_succeed_or_fail_cleanly(server):
    """Three at a time fill the arena; sixteen at a time must queue, fail with 503, or pass."""
    # A full-size request first, so that the arena's growth is not what this test measures
    # (see test_arena_fragmented_by_small_requests_refuses_large_ones for that).
    assert identity_request(server, FULL_SIZE)[0] == 200
    sizes = [(3 * MIB + 4096 * i) for i in range(48)]

    def one(i_size):
        index, size = i_size
        return (identity_request if index % 2 else upper_request)(server, size)

    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, enumerate(sizes), timeout=CLIENT_TIMEOUT * 2))
    assert time.monotonic() - started < CLIENT_TIMEOUT
    statuses = [status for status, _ in results]
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) >= 2, "not even the first requests got through"
    for status, body in results:
        if status == 503:
            message = json.loads(body)["error"]
            # Input arena (staging) or a stub's output arena (string_upper's result): both
            # state what was asked and what was free.
            assert EXHAUSTED.search(message), message
    wait_arena_empty(server)
    assert identity_request(server, FULL_SIZE)[0] == 200
    assert upper_request(server, FULL_SIZE)[0] == 200
    add_sub_works(server)
    wait_arena_empty(server)


# --- the HTTP body limit ------------------------------------------------------------------------


def _raw_exchange(server: ShoalServer, request: bytes, timeout: float = 10.0) -> bytes:
    """Send ``request`` on a raw socket; the response head and body."""
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(request)
        head, body = read_head_and_body(sock)
        return head + b"\r\n\r\n" + body


#: Triton's words for a JSON-only body over the limit, and for any other body.
_JSON_TOO_LARGE = (
    "request JSON size of {size} bytes exceeds the maximum allowed input size of {limit}"
)
_TOO_LARGE = "size of {size} bytes exceeds the maximum allowed value of {limit}"


@pytest.mark.parametrize(
    ("path", "extra", "words"),
    [
        ("/v2/models/add_sub/infer", "", _JSON_TOO_LARGE),
        ("/v2/models/add_sub/infer", "Inference-Header-Content-Length: 10\r\n", _TOO_LARGE),
        ("/v2/models/add_sub/generate", "", _JSON_TOO_LARGE),
        ("/v2/repository/index", "", _TOO_LARGE),
        ("/v2/logging", "", _TOO_LARGE),
    ],
)
def test_body_over_max_input_size_is_refused_unread(server, path, extra, words):
    """A huge Content-Length and a one-byte body: 400 at once, not after waiting for the body."""
    announced = 10**12
    request = (
        f"POST {path} HTTP/1.1\r\nHost: shoal\r\nContent-Length: {announced}\r\n{extra}\r\n{{"
    ).encode()
    answer = _raw_exchange(server, request)  # a server waiting for the body would never answer
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    error = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
    assert words.format(size=announced, limit=MAX_INPUT) in error, error
    assert "--http-max-input-size" in error
    add_sub_works(server)


def test_chunked_body_is_refused_once_over_the_limit(server):
    """No Content-Length: the body streams in, and is refused as soon as it passes the limit,
    while the client is still sending."""
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: shoal\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"%x\r\n" % MIB + b" " * MIB + b"\r\n"
        sent, answer = 0, b""
        while sent < 3 * MAX_INPUT // MIB:
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                break  # the server stopped reading: its answer is waiting
            sent += 1
            if select.select([sock], [], [], 0.02)[0]:
                break  # an answer came while we were still sending
        while b"\r\n\r\n" not in answer:
            more = sock.recv(65536)
            assert more, answer
            answer += more
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    # Refused soon after the limit, not at the end of what the client would have sent.
    assert MAX_INPUT // MIB <= sent < 2 * MAX_INPUT // MIB, sent
    add_sub_works(server)


def test_compressed_body_that_inflates_over_the_limit_is_refused(server):
    bomb = gzip.compress(b'{"inputs": [' + b" " * (MAX_INPUT + MIB) + b"]}")
    assert len(bomb) < MIB
    status, body, _ = _post(server, "/v2/models/add_sub/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 400, body
    assert "exceeds the maximum allowed value" in json.loads(body)["error"]
    add_sub_works(server)


def test_others_are_served_while_an_oversized_request_is_open(server):
    """The refused client keeps its connection open (the server would discard what it sends);
    meanwhile other clients are served."""
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: shoal\r\n"
            b"Content-Length: 1000000000000\r\n\r\n{"
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 400 ")
        for _ in range(5):
            add_sub_works(server)
        assert identity_request(server, 4 * MIB)[0] == 200
    wait_arena_empty(server)


# --- known bugs ---------------------------------------------------------------------------------


def test_output_region_error_leaks_input_arena():
    with ShoalServer(BUNDLED, extra_args=ARENA_ARGS, metrics=True) as server:
        bad_output = {
            "outputs": [
                {
                    "name": "OUT_UINT8",
                    "parameters": {
                        "shared_memory_region": "no-such-region",
                        "shared_memory_byte_size": MIB,
                    },
                }
            ]
        }
        for _ in range(3):
            status, body = identity_request(server, MIB, **bad_output)
            assert status == 404, body  # Triton's code
            assert (
                "Unable to find shared memory region: 'no-such-region'" in json.loads(body)["error"]
            )
        used = arena(server)[0]
        assert used == 0, f"three refused requests left {used} bytes in the input arena"


def arena_segments(pid: int) -> dict[int, dict[int, int]]:
    """{arena: {segment: bytes}} of the memfd arena segments process ``pid`` maps or holds an
    fd of (memfd pages live while either exists)."""
    found: dict[int, dict[int, int]] = {}
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            match = SEGMENT.search(line)
            if match:
                start, end = (int(x, 16) for x in line.split()[0].split("-"))
                found.setdefault(int(match[1]), {})[int(match[2])] = end - start
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            match = SEGMENT.search(os.readlink(f"/proc/{pid}/fd/{fd}"))
            size = os.stat(f"/proc/{pid}/fd/{fd}").st_size
        except OSError:
            continue  # closed meanwhile
        if match:
            found.setdefault(int(match[1]), {})[int(match[2])] = size
    return found


def over_the_limit(server: ShoalServer) -> dict[int, dict[int, dict[int, int]]]:
    """{pid: {arena: segments}} of every arena a process of the server holds more of than an
    arena may have: it holds on to segments that their owner has retired."""
    pids = [server.proc.pid, *server.stub_pids()]
    held = {pid: arena_segments(pid) for pid in pids}
    return {
        pid: {a: s for a, s in arenas.items() if sum(s.values()) > ARENA_LIMIT}
        for pid, arenas in held.items()
        if any(sum(s.values()) > ARENA_LIMIT for s in arenas.values())
    }


def test_arena_fragmented_by_small_requests_refuses_large_ones():
    """docs/hardening.md item 5, fixed: empty segments are retired to make room, and every
    process that mapped a retired segment drops it. The core's input arena is the one tested:
    frontend workers would stage these inputs into arenas of their own, so the server runs
    with none."""
    with ShoalServer(
        BUNDLED, extra_args=[*ARENA_ARGS, "--frontend-workers", "1"], metrics=True
    ) as server:
        # Bursts of twelve concurrent 1 MB requests grow the input arena (identity) and
        # string_upper's output arena 1 MiB at a time.
        for _ in range(5):
            with ThreadPoolExecutor(12) as pool:
                statuses = list(
                    pool.map(
                        lambda i: (
                            identity_request(server, 1000_000)[0]
                            if i % 2
                            else upper_text_request(server, 1000_000)
                        ),
                        range(24),
                    )
                )
            assert set(statuses) <= {200, 503}
            wait_arena_empty(server)
            if arena(server)[1] == ARENA_LIMIT:
                break
        grown = arena_segments(server.proc.pid)[0]
        status, body = identity_request(server, 4 * MIB)
        assert status == 200, json.loads(body)["error"]
        # The whole limit, now that nothing else is in the arena: in the input arena, and in
        # string_upper's output arena (which must retire its first segment too).
        assert identity_request(server, ARENA_LIMIT)[0] == 200
        assert upper_text_request(server, ARENA_LIMIT) == 200
        wait_arena_empty(server)
        # Every segment that the bursts grew, the first included, made room for one of the
        # limit's size.
        now = arena_segments(server.proc.pid)[0]
        assert list(now.values()) == [ARENA_LIMIT] and min(now) > max(grown), (grown, now)
        deadline = time.monotonic() + 10
        while (held := over_the_limit(server)) and time.monotonic() < deadline:
            time.sleep(0.05)  # SegmentRetired reaches idle stubs on their next read
        assert not held, f"processes still hold retired segments: {held}"
        add_sub_works(server)


def chain_request(server: ShoalServer, nbytes: int) -> int:
    """ens_chain (ens_scale, then identity) on ``nbytes`` of FP32: 2 * X comes back."""
    values = np.arange(nbytes // 4, dtype=np.float32) % 1000
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "X",
                    "datatype": "FP32",
                    "shape": [values.size],
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ],
            "outputs": [{"name": "Y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    status, body, json_size = _post(
        server,
        "/v2/models/ens_chain/infer",
        header + values.tobytes(),
        {"Inference-Header-Content-Length": str(len(header))},
    )
    if status == 200:
        assert body[json_size:] == (values * 2).tobytes()
    return status


def test_stubs_drop_retired_segments_of_another_stubs_arena():
    """identity maps ens_scale's output segments (an ensemble passes them by descriptor); when
    ens_scale retires them to fit a whole-limit tensor, identity's stub lets go of them too."""
    args = (*ARENA_ARGS, "--model-control-mode", "explicit", "--load-model", "ens_chain")
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=args, metrics=True) as server:
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda _: chain_request(server, 1000_000), range(16)))
        assert set(statuses) <= {200, 503} and 200 in statuses
        wait_arena_empty(server)
        assert chain_request(server, ARENA_LIMIT) == 200
        wait_arena_empty(server)
        deadline = time.monotonic() + 10
        while (held := over_the_limit(server)) and time.monotonic() < deadline:
            time.sleep(0.05)  # SegmentRetired reaches idle stubs on their next read
        assert not held, f"processes still hold retired segments: {held}"
