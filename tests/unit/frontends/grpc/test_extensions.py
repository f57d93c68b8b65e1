"""Triton's extension RPCs (statistics, repository, shared memory, logging, tracing) through
``tritonclient.grpc``, over a core that has them, one that lacks them and one part-way there."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as triton_pb
from tritonclient.grpc import service_pb2_grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from shoal.ipc.cuda import cuda_device_count
from tests.unit.frontends.doubles import LoopThread
from tests.unit.frontends.grpc.test_double import (
    BareCore,
    FullCore,
    NotImplementedCore,
    client_of,
    serving,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def ext_core() -> FullCore:
    return FullCore()


@pytest.fixture(scope="module")
def ext_url(loop_thread: LoopThread, ext_core: FullCore) -> Iterator[str]:
    with serving(loop_thread, ext_core) as url:
        yield url


@pytest.fixture
def client(ext_url: str, ext_core: FullCore) -> Iterator[grpcclient.InferenceServerClient]:
    ext_core.__init__()  # type: ignore[misc]
    with client_of(ext_url) as triton:
        yield triton


@pytest.fixture
def stub(ext_url: str) -> Iterator[Any]:
    with grpc.insecure_channel(ext_url) as channel:
        yield triton_grpc.GRPCInferenceServiceStub(channel)


def _error(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


# --- statistics -------------------------------------------------------------------------------


def test_statistics_of_every_model(client: Any) -> None:
    stats = client.get_inference_statistics().model_stats
    assert [(s.name, s.version) for s in stats] == [("echo", "1"), ("crash", "1")]


def test_statistics_of_one_model_carry_every_field(client: Any) -> None:
    (stats,) = client.get_inference_statistics("echo", "1", as_json=True)["model_stats"]
    assert stats["last_inference"] == "1700000000000"
    assert (stats["inference_count"], stats["execution_count"]) == ("12", "7")
    infer = stats["inference_stats"]
    assert infer["success"] == {"count": "10", "ns": "1000"}
    assert infer["fail"] == {"count": "2", "ns": "200"}
    assert infer["cache_miss"] == {"count": "3"}
    assert infer["queue"] == {}
    assert stats["batch_stats"] == [
        {
            "batch_size": "4",
            "compute_input": {},
            "compute_infer": {"count": "3", "ns": "22"},
            "compute_output": {},
        }
    ]
    assert stats["response_stats"]["0"]["success"] == {"count": "5", "ns": "33"}
    assert stats["memory_usage"] == [{"type": "CPU", "byte_size": "4096"}]


def test_statistics_of_an_unknown_model_are_not_found(client: Any) -> None:
    error = _error(lambda: client.get_inference_statistics("missing"))
    assert error.status() == "StatusCode.NOT_FOUND"


# --- model repository -------------------------------------------------------------------------


def test_repository_index(client: Any, stub: Any) -> None:
    index = client.get_model_repository_index(as_json=True)["models"]
    assert index == [
        {"name": "echo", "version": "1", "state": "READY"},
        {"name": "broken", "version": "1", "state": "UNAVAILABLE", "reason": "load failed"},
    ]
    ready = stub.RepositoryIndex(triton_pb.RepositoryIndexRequest(ready=True), timeout=10)
    assert [m.name for m in ready.models] == ["echo"]


def test_load_with_config_and_files(client: Any, ext_core: FullCore) -> None:
    client.load_model("echo")
    client.load_model("echo", config='{"backend": "python"}', files={"file:1/model.py": b"x"})
    assert ext_core.loads == [
        ("echo", None, None),
        ("echo", '{"backend": "python"}', {"file:1/model.py": b"x"}),
    ]


def test_unload_with_and_without_dependents(client: Any, ext_core: FullCore) -> None:
    client.unload_model("echo")
    client.unload_model("echo", unload_dependents=True)
    assert ext_core.unloads == [("echo", False), ("echo", True)]


def test_load_and_unload_errors_come_from_the_core(client: Any) -> None:
    assert _error(lambda: client.load_model("missing")).status() == "StatusCode.NOT_FOUND"
    error = _error(lambda: client.unload_model("fail_unavailable"))
    assert error.status() == "StatusCode.UNAVAILABLE"


@pytest.mark.parametrize(
    ("call", "request_message"),
    [
        ("RepositoryIndex", triton_pb.RepositoryIndexRequest(repository_name="r")),
        ("RepositoryModelLoad", triton_pb.RepositoryModelLoadRequest(repository_name="r")),
        ("RepositoryModelUnload", triton_pb.RepositoryModelUnloadRequest(repository_name="r")),
    ],
)
def test_naming_a_repository_is_unsupported(stub: Any, call: str, request_message: Any) -> None:
    with pytest.raises(grpc.RpcError) as info:
        getattr(stub, call)(request_message, timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert info.value.details() == "'repository_name' specification is not supported"


def test_load_parameters_of_the_wrong_type_are_invalid(stub: Any) -> None:
    request = triton_pb.RepositoryModelLoadRequest(model_name="echo")
    request.parameters["config"].bytes_param = b"{}"
    with pytest.raises(grpc.RpcError) as info:
        stub.RepositoryModelLoad(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'config' parameter to be a string_param" in info.value.details()


# --- shared memory ----------------------------------------------------------------------------


def test_system_shared_memory_register_status_unregister(client: Any) -> None:
    client.register_system_shared_memory("in", "/shm_in", 64, offset=8)
    client.register_system_shared_memory("out", "/shm_out", 32)
    status = client.get_system_shared_memory_status(as_json=True)["regions"]
    assert status == {
        "in": {"name": "in", "key": "/shm_in", "offset": "8", "byte_size": "64"},
        "out": {"name": "out", "key": "/shm_out", "byte_size": "32"},
    }
    assert list(client.get_system_shared_memory_status("out").regions) == ["out"]
    client.unregister_system_shared_memory("in")
    assert list(client.get_system_shared_memory_status().regions) == ["out"]
    client.unregister_system_shared_memory()
    assert not client.get_system_shared_memory_status().regions


def test_system_shared_memory_errors_come_from_the_core(client: Any) -> None:
    client.register_system_shared_memory("in", "/shm_in", 64)
    error = _error(lambda: client.register_system_shared_memory("in", "/other", 8))
    assert error.status() == "StatusCode.ALREADY_EXISTS"
    assert error.message() == "shared memory region 'in' already in manager"
    error = _error(lambda: client.get_system_shared_memory_status("nope"))
    assert error.status() == "StatusCode.NOT_FOUND"


def test_cuda_shared_memory_refused_handle(client: Any) -> None:
    raw_handle = base64.b64encode(bytes(64))  # tritonclient.grpc decodes it again
    error = _error(lambda: client.register_cuda_shared_memory("r", raw_handle, 0, 16))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    if cuda_device_count() == 0:
        expected = "failed to register CUDA shared memory region: 'r', GPUs not supported"
        assert error.message() == expected
    else:  # a handle of zeros opens no memory: the driver's reason follows the region's name
        assert error.message().startswith("failed to register CUDA shared memory region 'r': ")
    assert client.get_cuda_shared_memory_status().regions == {}
    error = _error(lambda: client.get_cuda_shared_memory_status("r"))
    assert error.status() == "StatusCode.NOT_FOUND"
    client.unregister_cuda_shared_memory("r")
    client.unregister_cuda_shared_memory()


# --- logging and tracing ----------------------------------------------------------------------


def test_log_settings_read_and_update(client: Any, ext_core: FullCore) -> None:
    assert client.get_log_settings(as_json=True)["settings"] == {
        "log_file": {"string_param": ""},
        "log_info": {"bool_param": True},
        "log_verbose_level": {"uint32_param": 0},
    }
    updated = client.update_log_settings({"log_verbose_level": 2, "log_info": False})
    assert updated.settings["log_verbose_level"].uint32_param == 2
    assert updated.settings["log_info"].bool_param is False
    assert ext_core.logging["log_verbose_level"] == 2


def test_log_settings_errors_come_from_the_core(client: Any) -> None:
    error = _error(lambda: client.update_log_settings({"log_colour": True}))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.message() == "unknown log setting 'log_colour'"


def test_trace_settings_start_off_and_update(client: Any) -> None:
    settings = client.get_trace_settings(as_json=True)["settings"]
    assert settings["trace_level"] == {"value": ["OFF"]}
    assert settings["trace_rate"] == {"value": ["1000"]}
    assert settings["trace_file"] == {"value": [""]}  # no trace file, as Triton answers it
    changed = client.update_trace_settings(settings={"trace_rate": "7"}, as_json=True)
    assert changed["settings"]["trace_rate"] == {"value": ["7"]}
    client.update_trace_settings(settings={"trace_rate": "1000"})
    error = _error(lambda: client.update_trace_settings(settings={"trace_level": ["LOUD"]}))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "unknown level 'LOUD'" in error.message()


# --- a core without the extensions ------------------------------------------------------------

WITHOUT = [
    (lambda c: c.get_inference_statistics(), "the statistics extension"),
    (lambda c: c.get_model_repository_index(), "the model repository extension"),
    (lambda c: c.load_model("echo"), "loading models"),
    (lambda c: c.unload_model("echo"), "unloading models"),
    (lambda c: c.get_system_shared_memory_status(), "system shared memory"),
    (lambda c: c.register_system_shared_memory("r", "/k", 8), "system shared memory"),
    (lambda c: c.unregister_system_shared_memory(), "system shared memory"),
    (lambda c: c.get_log_settings(), "the logging extension"),
    (lambda c: c.update_log_settings({"log_info": True}), "updating log settings"),
    (lambda c: c.get_trace_settings(), "the trace extension"),
    (lambda c: c.update_trace_settings(settings={"trace_rate": "1"}), "updating trace settings"),
]


@pytest.mark.parametrize("core_type", [BareCore, NotImplementedCore])
def test_missing_extensions_are_unimplemented(
    loop_thread: LoopThread, core_type: type[BareCore]
) -> None:
    with serving(loop_thread, core_type()) as url, client_of(url) as triton:
        for call, what in WITHOUT:
            error = _error(lambda call=call: call(triton))
            assert error.status() == "StatusCode.UNIMPLEMENTED", what
            assert error.message() == f"{what} is not supported by this server yet"
        assert triton.is_server_live()  # nothing crashed
