"""ModelInfer on the native server through tritonclient: its guard (a restricted inference
group, a bug in the core) as every other method has it, and plain and non-plain requests."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from shoal.frontends.grpc.native import NativeGrpcServer
from tests.unit.frontends.doubles import LoopThread
from tests.unit.frontends.grpc.test_double import FullCore

pytestmark = pytest.mark.timeout(60)


@contextmanager
def _client(thread: LoopThread, **options: Any) -> Iterator[grpcclient.InferenceServerClient]:
    server = NativeGrpcServer(FullCore(), **options)  # type: ignore[arg-type]
    port = thread.run(server.start("127.0.0.1", 0))
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        yield client
    finally:
        client.close()
        thread.run(server.stop(None))


def _inputs(name: str = "INPUT0") -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput(name, [1, 4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    return [tensor]


def test_a_restricted_inference_group_needs_the_key(loop_thread: LoopThread) -> None:
    with _client(loop_thread, restricted={"inference": ("infer-key", "yes")}) as client:
        with pytest.raises(InferenceServerException) as info:
            client.infer("echo", _inputs())
        assert info.value.status() == "StatusCode.PERMISSION_DENIED"
        assert info.value.message() == (
            "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"
        )
        headers = {"triton-grpc-protocol-infer-key": "yes"}
        result = client.infer("echo", _inputs(), headers=headers)
        assert result.as_numpy("INPUT0").tolist() == [[0.0, 1.0, 2.0, 3.0]]


def test_a_bug_in_the_core_is_internal(loop_thread: LoopThread) -> None:
    with _client(loop_thread) as client, pytest.raises(InferenceServerException) as info:
        client.infer("crash", _inputs())
    assert info.value.status() == "StatusCode.INTERNAL"
    assert info.value.message() == "internal error while serving ModelInfer; see the server log"


@pytest.mark.parametrize("parameters", [None, {"p": 3}], ids=["plain", "with-parameters"])
def test_a_request_is_answered_with_its_id_and_outputs(
    loop_thread: LoopThread, parameters: dict[str, Any] | None
) -> None:
    with _client(loop_thread) as client:
        result = client.infer("echo", _inputs(), request_id="r-1", parameters=parameters)
        response = result.get_response()
        assert (response.model_name, response.id) == ("echo", "r-1")
        assert result.as_numpy("INPUT0").tolist() == [[0.0, 1.0, 2.0, 3.0]]


def test_a_finished_call_leaves_no_cycle_for_the_collector(loop_thread: LoopThread) -> None:
    """A call, its reader and its task are freed by reference counting when it ends: a cycle
    per call would make the collector walk the young objects every few hundred calls."""
    with _client(loop_thread) as client:
        client.infer("echo", _inputs())
        gc.collect()
        gc.disable()
        try:
            for _ in range(20):
                client.infer("echo", _inputs())
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            left = [type(o).__name__ for o in gc.garbage]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert not [name for name in left if name in ("NativeCall", "MessageReader", "_Context")]
