"""The HTTP app served for real (uvicorn, 127.0.0.1, port 0) and driven by ``tritonclient.http``.

The core behind it is the ``EchoCore`` test double from conftest.py.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shoal.core import ErrorCode
from shoal.frontends.http.app import HTTP_STATUS
from tests.unit.frontends.doubles import FAIL_PREFIX, EchoCore, failure_message

pytestmark = pytest.mark.timeout(60)

Client = httpclient.InferenceServerClient

ARRAYS: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.array([[0, 7, 255]], np.uint8),
    "UINT16": np.array([[0, 7, 65535]], np.uint16),
    "UINT32": np.array([[0, 7, 2**32 - 1]], np.uint32),
    "UINT64": np.array([[0, 2**63, 2**64 - 1]], np.uint64),
    "INT8": np.array([[-128, 0, 127]], np.int8),
    "INT16": np.array([[-(2**15), 0, 2**15 - 1]], np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1]], np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1]], np.int64),
    "FP16": np.array([[1.5, -2.0, 0.1]], np.float16),
    "FP32": np.array([[0.1, -2.5, 3e38]], np.float32),
    "FP64": np.array([[0.1, -2.5, 1e300]], np.float64),
    "BYTES": np.array([[b"abc", b"", "é".encode()]], dtype=object),
}


@pytest.fixture(autouse=True)
def every_response_is_released(core: EchoCore) -> Iterator[None]:
    yield
    assert core.released == core.issued


def echo_input(name: str, array: np.ndarray, datatype: str, binary: bool) -> Any:
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def as_bytes(array: np.ndarray) -> list[Any]:
    """BYTES outputs come back as bytes (binary) or str (JSON); compare them as bytes."""
    return [item if isinstance(item, bytes) else item.encode() for item in array.reshape(-1)]


class TestInference:
    @pytest.mark.parametrize("binary_out", [True, False], ids=["out-binary", "out-json"])
    @pytest.mark.parametrize("binary_in", [True, False], ids=["in-binary", "in-json"])
    @pytest.mark.parametrize("datatype", list(ARRAYS))
    def test_every_datatype_round_trips(
        self, client: Client, core: EchoCore, datatype: str, binary_in: bool, binary_out: bool
    ) -> None:
        array = ARRAYS[datatype]
        requested = httpclient.InferRequestedOutput("X", binary_data=binary_out)
        result = client.infer(
            "echo", [echo_input("X", array, datatype, binary_in)], outputs=[requested]
        )
        output = result.as_numpy("X")
        assert output.shape == array.shape
        if datatype == "BYTES":
            assert as_bytes(output) == as_bytes(array)
        else:
            assert output.dtype == array.dtype
            np.testing.assert_array_equal(output, array)
        entry = result.get_output("X")
        assert ("data" in entry) is not binary_out
        received = core.requests[-1].inputs[0].data
        assert isinstance(received, memoryview) is binary_in

    @pytest.mark.parametrize("datatype", ["FP32", "INT64", "BOOL"])
    def test_large_json_request_and_response(
        self, client: Client, core: EchoCore, datatype: str
    ) -> None:
        # Over a megabyte each way: decoded and encoded in a thread, in pieces.
        array = np.resize(ARRAYS[datatype], (1, 300_000))
        requested = httpclient.InferRequestedOutput("X", binary_data=False)
        result = client.infer(
            "echo", [echo_input("X", array, datatype, False)], outputs=[requested]
        )
        np.testing.assert_array_equal(result.as_numpy("X"), array)
        assert result.as_numpy("X").dtype == array.dtype

    @pytest.mark.parametrize("binary_out", [True, False])
    def test_bf16_binary_input(self, client: Client, binary_out: bool) -> None:
        array = np.array([[1.5, -2.0, 0.0078125]], dtype=ml_dtypes.bfloat16)
        requested = httpclient.InferRequestedOutput("X", binary_data=binary_out)
        result = client.infer("echo", [echo_input("X", array, "BF16", True)], outputs=[requested])
        np.testing.assert_array_equal(
            result.as_numpy("X").astype(np.float32), array.astype(np.float32)
        )

    def test_outputs_default_to_binary_when_none_are_named(self, client: Client) -> None:
        array = ARRAYS["INT32"]
        result = client.infer("echo", [echo_input("X", array, "INT32", False)])
        assert result.get_output("X")["parameters"] == {"binary_data_size": 12}
        np.testing.assert_array_equal(result.as_numpy("X"), array)

    def test_several_inputs_and_outputs_keep_their_order(self, client: Client) -> None:
        inputs = [
            echo_input("A", ARRAYS["FP32"], "FP32", True),
            echo_input("B", ARRAYS["BYTES"], "BYTES", False),
            echo_input("C", ARRAYS["INT8"], "INT8", True),
        ]
        outputs = [
            httpclient.InferRequestedOutput("C", binary_data=True),
            httpclient.InferRequestedOutput("A", binary_data=False),
            httpclient.InferRequestedOutput("B", binary_data=True),
        ]
        result = client.infer("echo", inputs, outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("A"), ARRAYS["FP32"])
        assert as_bytes(result.as_numpy("B")) == as_bytes(ARRAYS["BYTES"])
        np.testing.assert_array_equal(result.as_numpy("C"), ARRAYS["INT8"])

    def test_id_version_and_parameters_reach_the_core(self, client: Client, core: EchoCore) -> None:
        result = client.infer(
            "echo",
            [echo_input("X", ARRAYS["INT8"], "INT8", True)],
            model_version="1",
            request_id="req-9",
            sequence_id=42,
            sequence_start=True,
            priority=2,
            parameters={"custom": "value", "scale": 0.5},
        )
        request = core.requests[-1]
        assert (request.model_name, request.model_version, request.id) == ("echo", "1", "req-9")
        assert request.parameters == {
            "sequence_id": 42,
            "sequence_start": True,
            "sequence_end": False,
            "priority": 2,
            "custom": "value",
            "scale": 0.5,
        }
        response = result.get_response()
        assert (response["id"], response["model_version"]) == ("req-9", "1")
        assert response["parameters"] == request.parameters

    @pytest.mark.parametrize("request_algorithm", [None, "gzip", "deflate"])
    @pytest.mark.parametrize("response_algorithm", [None, "gzip", "deflate"])
    def test_compression(
        self, client: Client, request_algorithm: str | None, response_algorithm: str | None
    ) -> None:
        array = np.arange(1000, dtype=np.float32).reshape(1, 1000)
        inputs = [
            echo_input("X", array, "FP32", True),
            echo_input("S", ARRAYS["BYTES"], "BYTES", False),
        ]
        outputs = [
            httpclient.InferRequestedOutput("X", binary_data=True),
            httpclient.InferRequestedOutput("S", binary_data=False),
        ]
        result = client.infer(
            "echo",
            inputs,
            outputs=outputs,
            request_compression_algorithm=request_algorithm,
            response_compression_algorithm=response_algorithm,
        )
        np.testing.assert_array_equal(result.as_numpy("X"), array)
        assert as_bytes(result.as_numpy("S")) == as_bytes(ARRAYS["BYTES"])


class TestInferenceErrors:
    @pytest.mark.parametrize("code", list(ErrorCode), ids=lambda code: code.name)
    def test_core_errors_keep_message_and_get_their_status(
        self, client: Client, code: ErrorCode
    ) -> None:
        model = FAIL_PREFIX + code.name.lower()
        with pytest.raises(InferenceServerException) as info:
            client.infer(model, [echo_input("X", ARRAYS["INT8"], "INT8", True)])
        assert info.value.status() == str(HTTP_STATUS[code])
        assert info.value.message() == failure_message(model)

    def test_unknown_model_is_404(self, client: Client) -> None:
        with pytest.raises(InferenceServerException) as info:
            client.infer("nope", [echo_input("X", ARRAYS["INT8"], "INT8", True)])
        assert info.value.status() == "404"
        assert info.value.message() == "Request for unknown model: 'nope' is not found"

    def test_unexpected_exception_is_500_without_details(self, client: Client) -> None:
        with pytest.raises(InferenceServerException) as info:
            client.infer("crash", [echo_input("X", ARRAYS["INT8"], "INT8", True)])
        assert info.value.status() == "500"
        assert info.value.message() == (
            "internal error while serving an inference request; see the server log"
        )

    def test_malformed_output_is_500_and_still_released(self, client: Client) -> None:
        with pytest.raises(InferenceServerException) as info:
            client.infer("bad_output", [echo_input("X", ARRAYS["INT8"], "INT8", True)])
        assert info.value.status() == "500"
        assert "output tensor shape does not match size of output for 'OUT'" in (
            info.value.message()
        )

    def test_non_utf8_bytes_as_json_is_400_and_still_released(
        self, client: Client, core: EchoCore
    ) -> None:
        array = np.array([b"\xff\xfe"], dtype=object)
        requested = httpclient.InferRequestedOutput("S", binary_data=False)
        with pytest.raises(InferenceServerException) as info:
            client.infer("echo", [echo_input("S", array, "BYTES", True)], outputs=[requested])
        assert info.value.status() == "400"
        assert "request the output with binary_data=true" in info.value.message()
        assert core.issued == 1

    def test_shape_not_matching_the_data_names_the_input(self, client: Client) -> None:
        tensor = httpclient.InferInput("X", [2, 2], "FP32")
        tensor.set_data_from_numpy(np.zeros((2, 2), np.float32))
        tensor.set_shape([2, 3])
        with pytest.raises(InferenceServerException) as info:
            client.infer("echo", [tensor])
        assert info.value.status() == "400"
        assert info.value.message() == (
            "input byte size mismatch for input 'X' for model 'echo'. Expected 24, got 16"
        )


def http(url: str, method: str, path: str, **kwargs: Any) -> requests.Response:
    return requests.request(method, f"http://{url}{path}", timeout=30, **kwargs)


class TestRawRequests:
    def test_bad_json(self, url: str) -> None:
        reply = http(url, "POST", "/v2/models/echo/infer", data=b'{"inputs": [')
        assert reply.status_code == 400
        assert reply.headers["content-type"] == "application/json"
        assert reply.json()["error"].startswith("failed to parse the request JSON buffer")

    def test_string_in_an_int32_tensor(self, url: str) -> None:
        document = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [2], "data": [1, "a"]}]}
        reply = http(url, "POST", "/v2/models/echo/infer", json=document)
        assert reply.status_code == 400
        assert reply.json() == {
            "error": "Unable to parse 'data' for input 'X': attempt to access JSON "
            "non-signed-integer as signed-integer: expected an integer for datatype "
            'INT32, got "a"'
        }

    def test_json_request_and_response(self, url: str) -> None:
        document = {
            "id": "j",
            "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [[1, 2.5]]}],
        }
        reply = http(url, "POST", "/v2/models/echo/versions/1/infer", json=document)
        assert reply.status_code == 200 and "inference-header-content-length" not in reply.headers
        assert reply.json() == {
            "id": "j",
            "model_name": "echo",
            "model_version": "1",
            "outputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.5]}],
        }

    def test_chunked_request_body(self, url: str) -> None:
        body = json.dumps(
            {"inputs": [{"name": "X", "datatype": "INT8", "shape": [1], "data": [3]}]}
        ).encode()
        reply = http(url, "POST", "/v2/models/echo/infer", data=iter([body[:10], body[10:]]))
        assert reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [3]

    def test_unsupported_content_encoding_is_501_with_the_supported_ones(self, url: str) -> None:
        reply = http(
            url, "POST", "/v2/models/echo/infer", data=b"{}", headers={"Content-Encoding": "br"}
        )
        assert reply.status_code == 501
        assert reply.headers["accept-encoding"] == "gzip, deflate"
        assert reply.json()["error"].startswith("Unsupported compression type 'br'")

    def test_bad_version_string(self, url: str) -> None:
        reply = http(url, "GET", "/v2/models/echo/versions/latest")
        assert reply.status_code == 400
        assert "version should be an integral value" in reply.json()["error"]

    def test_unknown_path_is_404_json(self, url: str) -> None:
        reply = http(url, "GET", "/v2/nothing/here")
        assert (reply.status_code, reply.json()) == (404, {"error": "Not Found"})

    def test_wrong_method_is_405_json(self, url: str) -> None:
        reply = http(url, "GET", "/v2/models/echo/infer")
        assert (reply.status_code, reply.json()) == (405, {"error": "Method Not Allowed"})
        assert reply.headers["allow"] == "POST"


class TestHealthAndMetadata:
    def test_live_and_ready(self, client: Client, core: EchoCore, url: str) -> None:
        assert client.is_server_live() and client.is_server_ready()
        # The KServe V2 bodies, which the KServe SDK reads (tritonclient reads the status).
        assert http(url, "GET", "/v2/health/live").json() == {"live": True}
        assert http(url, "GET", "/v2/health/ready").json() == {"ready": True}
        core.live = core.ready = False
        assert not client.is_server_live() and not client.is_server_ready()
        for key in ("live", "ready"):
            reply = http(url, "GET", f"/v2/health/{key}")
            assert (reply.status_code, reply.json()) == (400, {key: False})
            assert reply.headers["content-type"] == "application/json"

    def test_server_metadata(self, client: Client) -> None:
        assert client.get_server_metadata() == {
            "name": "shoal",
            "version": "0.1.0",
            "extensions": ["binary_tensor_data", "model_configuration"],
        }

    @pytest.mark.parametrize("version", ["", "1"])
    def test_model_metadata(self, client: Client, version: str) -> None:
        tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 3]}
        assert client.get_model_metadata("echo", version) == {
            "name": "echo",
            "versions": ["1"],
            "platform": "python",
            "inputs": [tensor],
            "outputs": [tensor],
        }

    def test_model_config_passes_the_version(self, client: Client) -> None:
        config = client.get_model_config("echo", "1")
        assert config == {"name": "echo", "backend": "python", "max_batch_size": 8, "version": "1"}

    def test_model_ready(self, client: Client, url: str) -> None:
        assert client.is_model_ready("echo") and client.is_model_ready("echo", "1")
        assert not client.is_model_ready("echo", "2") and not client.is_model_ready("nope")
        reply = http(url, "GET", "/v2/models/nope/ready")
        assert (reply.status_code, reply.json()) == (400, {"error": "Model version not ready"})

    @pytest.mark.parametrize("method", ["get_model_metadata", "get_model_config"])
    def test_unknown_model(self, client: Client, method: str) -> None:
        with pytest.raises(InferenceServerException) as info:
            getattr(client, method)("nope")
        assert info.value.status() == "404"
        assert info.value.message() == "Request for unknown model: 'nope' is not found"

    def test_core_error_on_metadata(self, client: Client) -> None:
        with pytest.raises(InferenceServerException) as info:
            client.get_model_metadata("fail_unavailable")
        assert info.value.status() == "503"
        assert info.value.message() == failure_message("fail_unavailable")


LIMIT = 4096


@pytest.fixture(scope="module")
def small_url(serve: Callable[..., str]) -> str:
    """A server whose infer bodies may not exceed LIMIT bytes, with its own core."""
    return serve(EchoCore(), max_input_size=LIMIT)


class TestSizeLimit:
    def test_binary_request_over_the_limit_is_refused_and_the_connection_reused(
        self, small_url: str
    ) -> None:
        with httpclient.InferenceServerClient(small_url) as triton:
            big = np.zeros((1, 1 << 20), np.float32)  # 4 MiB: refused before it is read
            with pytest.raises(InferenceServerException) as info:
                triton.infer("echo", [echo_input("X", big, "FP32", True)])
            assert info.value.status() == "400"
            message = info.value.message()
            assert message.startswith("Request size of ")
            assert message.endswith(
                f"exceeds the maximum allowed value of {LIMIT} bytes. "
                "Use --http-max-input-size to increase the limit."
            )
            small = np.ones((1, 8), np.float32)
            result = triton.infer("echo", [echo_input("X", small, "FP32", True)])
            np.testing.assert_array_equal(result.as_numpy("X"), small)

    def test_json_request_over_the_limit(self, small_url: str) -> None:
        document = {
            "inputs": [{"name": "X", "datatype": "INT32", "shape": [2000], "data": [7] * 2000}]
        }
        reply = http(small_url, "POST", "/v2/models/echo/infer", json=document)
        assert reply.status_code == 400
        assert reply.json()["error"].startswith("request JSON size of ")

    def test_chunked_request_over_the_limit(self, small_url: str) -> None:
        chunks = iter([b"x" * 3000, b"x" * 3000])
        reply = http(small_url, "POST", "/v2/models/echo/infer", data=chunks)
        assert reply.status_code == 400
        message = reply.json()["error"]
        # The size is named when the server happened to receive both chunks at once.
        assert message.startswith("request JSON size ")
        assert f"exceeds the maximum allowed input size of {LIMIT} bytes" in message

    def test_compressed_request_inflating_over_the_limit(self, small_url: str) -> None:
        body = json.dumps({"inputs": [], "padding": " " * 10_000}).encode()
        reply = http(
            small_url,
            "POST",
            "/v2/models/echo/infer",
            data=gzip.compress(body),
            headers={"Content-Encoding": "gzip"},
        )
        assert reply.status_code == 400
        assert reply.json()["error"].startswith("Decompressed request size exceeds")

    def test_request_at_the_limit_is_served(self, small_url: str) -> None:
        document = {"inputs": [{"name": "X", "datatype": "INT8", "shape": [1], "data": [1]}]}
        body = json.dumps(document).encode()
        body += b" " * (LIMIT - len(body))
        reply = http(small_url, "POST", "/v2/models/echo/infer", data=body)
        assert reply.status_code == 200


def test_a_large_json_response_cancelled_while_encoded_is_released_after_on_the_loop() -> None:
    import asyncio
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from shoal.core import InferOutput, InferResponse
    from shoal.frontends.http import _slow_ways, codec

    events: list[tuple[str, int]] = []

    class Recording(ThreadPoolExecutor):
        """Says when each job (the encoding) has ended."""

        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            def job() -> Any:
                try:
                    return fn(*args, **kwargs)
                finally:
                    events.append(("encoded", threading.get_ident()))

            return super().submit(job)

    values = np.arange(1_000_000, dtype=np.float32)
    output = InferOutput("Y", "FP32", values.shape, memoryview(values.tobytes()))
    response = InferResponse(
        "m",
        "1",
        outputs=[output],
        _release=lambda: events.append(("released", threading.get_ident())),
    )
    decoded = codec.decode_infer_request(b'{"inputs":[]}', model_name="m")

    async def cancel_then_wait() -> int:
        asyncio.get_running_loop().set_default_executor(Recording(1))
        task = asyncio.ensure_future(_slow_ways.encoded_in_thread(response, decoded))
        await asyncio.sleep(0)  # the encoding is on its way to its thread now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 30
        while len(events) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return threading.get_ident()

    loop_thread = asyncio.run(cancel_then_wait())
    (encoded, encoder), (released, releaser) = events
    assert (encoded, released) == ("encoded", "released")  # the outputs were read, then released
    assert encoder != loop_thread and releaser == loop_thread
