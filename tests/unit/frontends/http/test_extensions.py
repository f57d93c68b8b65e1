"""Triton's protocol extensions over HTTP, driven by ``tritonclient.http`` against the app served
for real (uvicorn, 127.0.0.1, port 0) over the in-memory ``EchoCore`` double.

Statistics, model repository, system and CUDA shared memory, logging, shared-memory tensors in
infer requests, and cores that lack the extension methods.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shoal.ipc.cuda import cuda_device_count
from tests.unit.frontends.doubles import (
    DEFAULT_LOG_SETTINGS,
    BaseEchoCore,
    EchoCore,
    UnimplementedCore,
    failure_message,
)

pytestmark = pytest.mark.timeout(60)

Client = httpclient.InferenceServerClient

ECHO_STATS_JSON: dict[str, Any] = {
    "name": "echo",
    "version": "1",
    "last_inference": 1_700_000_000_000,
    "inference_count": 12,
    "execution_count": 7,
    "inference_stats": {
        "success": {"count": 10, "ns": 1000},
        "fail": {"count": 2, "ns": 200},
        "queue": {"count": 10, "ns": 300},
        "compute_input": {"count": 10, "ns": 400},
        "compute_infer": {"count": 10, "ns": 500},
        "compute_output": {"count": 10, "ns": 600},
        "cache_hit": {"count": 1, "ns": 70},
        "cache_miss": {"count": 3, "ns": 80},
    },
    "response_stats": {
        "0": {
            "compute_infer": {"count": 5, "ns": 31},
            "compute_output": {"count": 5, "ns": 32},
            "success": {"count": 5, "ns": 33},
            "fail": {"count": 1, "ns": 34},
            "empty_response": {"count": 2, "ns": 35},
            "cancel": {"count": 1, "ns": 36},
        }
    },
    "batch_stats": [
        {
            "batch_size": 1,
            "compute_input": {"count": 4, "ns": 11},
            "compute_infer": {"count": 4, "ns": 12},
            "compute_output": {"count": 4, "ns": 13},
        },
        {
            "batch_size": 4,
            "compute_input": {"count": 3, "ns": 21},
            "compute_infer": {"count": 3, "ns": 22},
            "compute_output": {"count": 3, "ns": 23},
        },
    ],
    "memory_usage": [
        {"type": "CPU", "id": 0, "byte_size": 4096},
        {"type": "GPU", "id": 1, "byte_size": 1 << 20},
    ],
}


@pytest.fixture(autouse=True)
def fresh_core(core: EchoCore) -> Iterator[EchoCore]:
    """Every test starts from the double's initial state and releases what it was given."""
    yield core
    assert core.released == core.issued


def http(url: str, method: str, path: str, **kwargs: Any) -> requests.Response:
    return requests.request(method, f"http://{url}{path}", timeout=30, **kwargs)


def server_error(call: Callable[[], Any]) -> tuple[str, str]:
    """The (status, message) of the InferenceServerException that ``call`` raises."""
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value.status(), info.value.message()


class TestStatistics:
    @pytest.mark.parametrize(
        ("name", "version"),
        [("", ""), ("echo", ""), ("echo", "1")],
        ids=["all", "model", "version"],
    )
    def test_each_route_reaches_the_core_and_parses_in_tritonclient(
        self, client: Client, core: EchoCore, name: str, version: str
    ) -> None:
        stats = client.get_inference_statistics(name, version)
        assert stats == {"model_stats": [ECHO_STATS_JSON]}
        assert core.stats_calls == [(name, version)]

    def test_fields_are_in_tritons_order(self, url: str) -> None:
        reply = http(url, "GET", "/v2/models/echo/stats")
        assert reply.headers["content-type"] == "application/json"
        (stat,) = reply.json()["model_stats"]
        assert list(stat) == list(ECHO_STATS_JSON)
        assert list(stat["inference_stats"]) == list(ECHO_STATS_JSON["inference_stats"])

    def test_stats_is_not_taken_for_a_model_name(self, url: str, core: EchoCore) -> None:
        assert http(url, "GET", "/v2/models/stats").json() == {"model_stats": [ECHO_STATS_JSON]}
        assert core.stats_calls == [("", "")]

    def test_unknown_model_is_the_cores_error(self, client: Client) -> None:
        status, message = server_error(lambda: client.get_inference_statistics("nope"))
        assert (status, message) == ("404", "requested model 'nope' is not found")

    def test_bad_version_string(self, url: str, core: EchoCore) -> None:
        reply = http(url, "GET", "/v2/models/echo/versions/one/stats")
        assert reply.status_code == 400
        assert "version should be an integral value" in reply.json()["error"]
        assert core.stats_calls == []


class TestRepository:
    def test_index_leaves_out_empty_fields(self, client: Client) -> None:
        assert client.get_model_repository_index() == [
            {
                "name": "broken",
                "version": "1",
                "state": "UNAVAILABLE",
                "reason": "load failed: bad config",
            },
            {"name": "echo", "version": "1", "state": "READY"},
            {"name": "lazy"},
        ]

    def test_index_of_ready_models(self, url: str) -> None:
        reply = http(url, "POST", "/v2/repository/index", json={"ready": True})
        assert reply.json() == [{"name": "echo", "version": "1", "state": "READY"}]
        assert len(http(url, "POST", "/v2/repository/index", json={"ready": False}).json()) == 3

    def test_index_ready_must_be_a_boolean(self, url: str) -> None:
        reply = http(url, "POST", "/v2/repository/index", json={"ready": "yes"})
        assert (reply.status_code, reply.json()) == (
            400,
            {"error": "Unable to parse 'ready': expected a boolean"},
        )

    def test_load_without_parameters(self, client: Client, core: EchoCore) -> None:
        client.load_model("added")
        assert core.loads == [("added", None, None)]
        assert {"name": "added", "version": "1", "state": "READY"} in (
            client.get_model_repository_index()
        )

    def test_load_with_config_and_files(self, client: Client, core: EchoCore) -> None:
        config = json.dumps({"backend": "python", "max_batch_size": 4})
        files = {"file:1/model.py": b"print('hi')\n", "file:1/weights.bin": bytes(range(256))}
        client.load_model("added", config=config, files=files)
        assert core.loads == [("added", config, files)]

    def test_load_success_has_an_empty_body(self, url: str) -> None:
        reply = http(url, "POST", "/v2/repository/models/added/load")
        assert (reply.status_code, reply.content) == (200, b"")

    @pytest.mark.parametrize(
        ("parameters", "message"),
        [
            ({"file:x": "not base64!"}, "Unable to parse 'file:x': invalid base64 content"),
            ({"config": {"backend": "python"}}, "Unable to parse 'config': expected a string"),
            ({"weights": "AAAA"}, "unexpected load parameter 'weights'"),
            ({"file:": "AAAA"}, "unexpected load parameter 'file:'"),
        ],
    )
    def test_bad_load_parameters(
        self, url: str, core: EchoCore, parameters: dict[str, Any], message: str
    ) -> None:
        reply = http(url, "POST", "/v2/repository/models/m/load", json={"parameters": parameters})
        assert reply.status_code == 400
        assert reply.json()["error"].startswith(message)
        assert core.loads == []

    @pytest.mark.parametrize("dependents", [False, True])
    def test_unload(self, client: Client, core: EchoCore, dependents: bool) -> None:
        client.unload_model("echo", unload_dependents=dependents)
        assert core.unloads == [("echo", dependents)]
        entry = {"name": "echo", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
        assert entry in client.get_model_repository_index()

    def test_unload_without_a_body(self, url: str, core: EchoCore) -> None:
        reply = http(url, "POST", "/v2/repository/models/echo/unload")
        assert (reply.status_code, reply.content) == (200, b"")
        assert core.unloads == [("echo", False)]

    def test_unload_dependents_must_be_a_boolean(self, url: str) -> None:
        body = {"parameters": {"unload_dependents": 1}}
        reply = http(url, "POST", "/v2/repository/models/echo/unload", json=body)
        assert reply.status_code == 400
        assert reply.json() == {"error": "Unable to parse 'unload_dependents': expected a boolean"}

    @pytest.mark.parametrize("action", ["load_model", "unload_model"])
    def test_core_errors_keep_status_and_message(self, client: Client, action: str) -> None:
        status, message = server_error(lambda: getattr(client, action)("fail_unavailable"))
        assert (status, message) == ("503", failure_message("fail_unavailable"))

    def test_bad_json(self, url: str) -> None:
        reply = http(url, "POST", "/v2/repository/models/m/load", data=b"{")
        assert reply.status_code == 400
        assert reply.json()["error"].startswith("failed to parse the request JSON buffer")

    def test_wrong_method(self, url: str) -> None:
        assert http(url, "GET", "/v2/repository/index").status_code == 405

    def test_load_bodies_obey_the_size_limit(self, serve: Callable[..., str]) -> None:
        small = EchoCore()
        with httpclient.InferenceServerClient(serve(small, max_input_size=1024)) as triton:
            status, message = server_error(
                lambda: triton.load_model("m", config="{}", files={"file:w": bytes(2048)})
            )
            assert status == "400"
            assert "exceeds the maximum allowed value of 1024 bytes" in message
            triton.load_model("m", config="{}", files={"file:w": bytes(16)})
        assert small.loads == [("m", "{}", {"file:w": bytes(16)})]


class TestSystemSharedMemory:
    def test_register_status_unregister(self, client: Client, core: EchoCore) -> None:
        client.register_system_shared_memory("in", "/shoal_in", byte_size=64)
        client.register_system_shared_memory("out", "/shoal_out", byte_size=32, offset=16)
        assert client.get_system_shared_memory_status() == [
            {"name": "in", "key": "/shoal_in", "offset": 0, "byte_size": 64},
            {"name": "out", "key": "/shoal_out", "offset": 16, "byte_size": 32},
        ]
        assert client.get_system_shared_memory_status("out") == [
            {"name": "out", "key": "/shoal_out", "offset": 16, "byte_size": 32},
        ]
        client.unregister_system_shared_memory("in")
        assert list(core.regions) == ["out"]
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status() == []

    def test_status_of_an_unknown_region(self, client: Client) -> None:
        status, message = server_error(lambda: client.get_system_shared_memory_status("nope"))
        assert (status, message) == ("404", "Unable to find system shared memory region: 'nope'")

    def test_registering_a_taken_name_is_400(self, client: Client) -> None:
        client.register_system_shared_memory("in", "/a", byte_size=8)
        status, message = server_error(
            lambda: client.register_system_shared_memory("in", "/b", byte_size=8)
        )
        assert (status, message) == ("400", "shared memory region 'in' already in manager")

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            ({"byte_size": 8}, "Shared memory register request has no 'key' field"),
            ({"key": "/k"}, "Shared memory register request has no 'byte_size' field"),
            ({"key": 7, "byte_size": 8}, "Unable to parse 'key': expected a string"),
            (
                {"key": "/k", "byte_size": -1},
                "Unable to parse 'byte_size': expected a non-negative integer",
            ),
            (
                {"key": "/k", "offset": 1.5, "byte_size": 8},
                "Unable to parse 'offset': expected a non-negative integer",
            ),
        ],
    )
    def test_bad_register_body(
        self, url: str, core: EchoCore, body: dict[str, Any], message: str
    ) -> None:
        reply = http(url, "POST", "/v2/systemsharedmemory/region/r/register", json=body)
        assert (reply.status_code, reply.json()) == (400, {"error": message})
        assert core.regions == {}

    def test_register_needs_a_region_name(self, url: str) -> None:
        body = {"key": "/k", "byte_size": 8}
        reply = http(url, "POST", "/v2/systemsharedmemory/register", json=body)
        assert reply.status_code == 400
        assert reply.json() == {
            "error": "'region name' is necessary to register system shared memory region"
        }

    def test_success_has_an_empty_body(self, url: str) -> None:
        body = {"key": "/k", "byte_size": 8}
        reply = http(url, "POST", "/v2/systemsharedmemory/region/r/register", json=body)
        assert (reply.status_code, reply.content) == (200, b"")
        reply = http(url, "POST", "/v2/systemsharedmemory/region/r/unregister")
        assert (reply.status_code, reply.content) == (200, b"")

    def test_unregistering_an_unknown_region_is_the_cores_call(self, client: Client) -> None:
        client.unregister_system_shared_memory("never-registered")  # the double, as Triton: ok


class TestCudaSharedMemory:
    def test_status_lists_no_regions(self, client: Client) -> None:
        assert client.get_cuda_shared_memory_status() == []

    def test_status_of_a_named_region_is_404(self, client: Client) -> None:
        status, message = server_error(lambda: client.get_cuda_shared_memory_status("r"))
        assert (status, message) == ("404", "Unable to find cuda shared memory region: 'r'")

    def test_refused_handle_is_triton_400(self, client: Client) -> None:
        handle = base64.b64encode(bytes(64)).decode()
        status, message = server_error(
            lambda: client.register_cuda_shared_memory("r", handle, device_id=0, byte_size=8)
        )
        assert status == "400"
        if cuda_device_count() == 0:
            assert (
                message == "failed to register CUDA shared memory region: 'r', GPUs not supported"
            )
        else:  # a handle of zeros opens no memory: the driver's reason follows the region's name
            assert message.startswith("failed to register CUDA shared memory region 'r': ")

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            (
                {"device_id": 0, "byte_size": 8},
                "Shared memory register request has no 'raw_handle'",
            ),
            ({"raw_handle": {"b64": "@@"}, "device_id": 0, "byte_size": 8}, "is not base64"),
            ({"raw_handle": "x", "device_id": 0, "byte_size": 8}, "expected a JSON object"),
            ({"raw_handle": {"b64": ""}, "device_id": -1, "byte_size": 8}, "'device_id'"),
        ],
    )
    def test_malformed_register_is_400(self, url: str, body: Any, message: str) -> None:
        reply = http(url, "POST", "/v2/cudasharedmemory/region/r/register", json=body)
        assert reply.status_code == 400
        assert message in reply.json()["error"]

    def test_unregister_succeeds(self, client: Client) -> None:
        client.unregister_cuda_shared_memory("r")
        client.unregister_cuda_shared_memory()


class TestLogging:
    def test_get(self, client: Client) -> None:
        assert client.get_log_settings() == DEFAULT_LOG_SETTINGS

    def test_update_returns_every_setting(self, client: Client, core: EchoCore) -> None:
        updated = client.update_log_settings({"log_verbose_level": 2, "log_info": False})
        assert updated == {**DEFAULT_LOG_SETTINGS, "log_verbose_level": 2, "log_info": False}
        assert core.log == updated
        assert client.get_log_settings() == updated

    def test_null_leaves_a_setting_alone(self, url: str, core: EchoCore) -> None:
        reply = http(url, "POST", "/v2/logging", json={"log_info": None, "log_error": False})
        assert reply.status_code == 200
        assert reply.json() == {**DEFAULT_LOG_SETTINGS, "log_error": False}

    def test_empty_body_changes_nothing(self, url: str) -> None:
        reply = http(url, "POST", "/v2/logging")
        assert (reply.status_code, reply.json()) == (200, DEFAULT_LOG_SETTINGS)

    def test_core_refusals_keep_their_status(self, client: Client) -> None:
        status, message = server_error(lambda: client.update_log_settings({"log_colour": True}))
        assert (status, message) == ("400", "unknown log setting 'log_colour'")

    def test_values_must_be_scalars(self, url: str, core: EchoCore) -> None:
        reply = http(url, "POST", "/v2/logging", json={"log_format": ["ISO8601"]})
        assert reply.status_code == 400
        assert reply.json()["error"] == (
            "Unable to parse 'log_format': expected a boolean, an integer or a string"
        )
        assert core.log == DEFAULT_LOG_SETTINGS


class TestSharedMemoryTensors:
    def test_shm_input_and_output_reach_the_core_and_come_back_without_data(
        self, client: Client, core: EchoCore
    ) -> None:
        tensor = httpclient.InferInput("X", [1, 3], "INT32")
        tensor.set_shared_memory("in_region", 12, offset=4)
        requested = httpclient.InferRequestedOutput("X")
        requested.set_shared_memory("out_region", 64)
        result = client.infer("echo", [tensor], outputs=[requested])

        (received,) = core.requests[-1].inputs
        assert memoryview(received.data).nbytes == 0
        assert received.parameters == {
            "shared_memory_region": "in_region",
            "shared_memory_byte_size": 12,
            "shared_memory_offset": 4,
        }
        (asked,) = core.requests[-1].outputs
        assert asked.parameters == {
            "shared_memory_region": "out_region",
            "shared_memory_byte_size": 64,
        }
        # No data, no binary section, and (as Triton) no shared_memory_* parameters.
        assert result.get_response()["outputs"] == [
            {"name": "X", "datatype": "INT32", "shape": [1, 3]}
        ]

    def test_shm_output_beside_a_binary_one_adds_no_bytes(self, url: str, core: EchoCore) -> None:
        a = np.arange(4, dtype=np.float32).reshape(1, 4)
        inputs = [
            httpclient.InferInput("A", [1, 4], "FP32"),
            httpclient.InferInput("B", [2], "INT8"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(np.array([1, 2], np.int8))
        in_shm = httpclient.InferRequestedOutput("B")
        in_shm.set_shared_memory("out_region", 2)
        outputs = [in_shm, httpclient.InferRequestedOutput("A", binary_data=True)]
        with httpclient.InferenceServerClient(url) as triton:
            result = triton.infer("echo", inputs, outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("A"), a)
        # No "data" and no bytes for B: A's bytes are the whole binary section.
        assert result.get_output("B") == {"name": "B", "datatype": "INT8", "shape": [2]}

    def test_a_response_of_shm_outputs_only_is_plain_json(self, url: str) -> None:
        shm = {"shared_memory_region": "r", "shared_memory_byte_size": 4}
        document = {
            "inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "parameters": shm}],
            "outputs": [{"name": "X", "parameters": shm}],
            "parameters": {"binary_data_output": True},
        }
        reply = http(url, "POST", "/v2/models/echo/infer", json=document)
        assert reply.status_code == 200
        assert reply.headers["content-type"] == "application/json"
        assert "inference-header-content-length" not in reply.headers
        assert reply.json()["outputs"] == [{"name": "X", "datatype": "FP32", "shape": [1]}]

    def test_shm_input_with_data_is_refused(self, url: str, core: EchoCore) -> None:
        entry = {
            "name": "X",
            "datatype": "INT8",
            "shape": [1],
            "data": [1],
            "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 1},
        }
        reply = http(url, "POST", "/v2/models/echo/infer", json={"inputs": [entry]})
        assert reply.status_code == 400
        assert "'shared_memory_region'" in reply.json()["error"]
        assert core.requests == []


EXTENSION_CALLS: list[tuple[str, str, str, str]] = [
    ("statistics", "GET", "/v2/models/stats", ""),
    ("statistics", "GET", "/v2/models/echo/versions/1/stats", ""),
    ("model repository", "POST", "/v2/repository/index", ""),
    ("model repository", "POST", "/v2/repository/models/m/load", "{}"),
    ("model repository", "POST", "/v2/repository/models/m/unload", ""),
    ("system shared memory", "GET", "/v2/systemsharedmemory/status", ""),
    ("system shared memory", "GET", "/v2/systemsharedmemory/region/r/status", ""),
    (
        "system shared memory",
        "POST",
        "/v2/systemsharedmemory/region/r/register",
        '{"key": "/k", "byte_size": 8}',
    ),
    ("system shared memory", "POST", "/v2/systemsharedmemory/unregister", ""),
    ("logging", "GET", "/v2/logging", ""),
    ("logging", "POST", "/v2/logging", '{"log_info": true}'),
]


@pytest.fixture(scope="module")
def extensionless_urls(serve: Callable[..., str]) -> dict[str, str]:
    """Servers over a core lacking the extension methods, and one whose methods raise."""
    return {"missing": serve(BaseEchoCore()), "not-implemented": serve(UnimplementedCore())}


@pytest.mark.parametrize("kind", ["missing", "not-implemented"])
@pytest.mark.parametrize(("extension", "method", "path", "body"), EXTENSION_CALLS)
def test_a_core_without_the_extension_answers_501(
    extensionless_urls: dict[str, str],
    kind: str,
    extension: str,
    method: str,
    path: str,
    body: str,
) -> None:
    url = extensionless_urls[kind]
    reply = http(url, method, path, data=body)
    assert (reply.status_code, reply.json()) == (
        501,
        {"error": f"{extension} is not supported by this server"},
    )
    assert http(url, "GET", "/v2/health/live").status_code == 200  # and it keeps serving


def test_tritonclient_reads_the_501(extensionless_urls: dict[str, str]) -> None:
    with httpclient.InferenceServerClient(extensionless_urls["missing"]) as triton:
        status, message = server_error(triton.get_inference_statistics)
        assert (status, message) == ("501", "statistics is not supported by this server")
        status, message = server_error(triton.get_cuda_shared_memory_status)
        assert (status, message) == ("501", "CUDA shared memory is not supported by this server")
