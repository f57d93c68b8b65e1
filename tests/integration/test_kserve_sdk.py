"""The KServe Python SDK's clients (InferenceRESTClient, InferenceGRPCClient) against shoal.

The SDK is one of the third-party tools that must work unmodified. Unlike tritonclient it reads
the health answers' KServe V2 bodies (``{"live": true}``, ``{"ready": true}``), not only their
status, and decodes responses with its own binary-extension reader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc
import httpx
import numpy as np
import pytest
from kserve import (
    InferenceGRPCClient,
    InferenceRESTClient,
    InferInput,
    InferRequest,
    RESTConfig,
)

from tests.integration.server import BUNDLED, ShoalServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    with ShoalServer(BUNDLED) as srv:
        yield srv


def _run(call: Callable[[], Awaitable[object]]) -> object:
    return asyncio.run(call())  # type: ignore[arg-type]


def _add_sub_request(binary: bool, request_id: str) -> InferRequest:
    a = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    b = np.array([0.5, 0.5, 1.0, 8.0], dtype=np.float32)
    inputs = []
    for name, data in (("INPUT0", a), ("INPUT1", b)):
        tensor = InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(data, binary_data=binary)
        inputs.append(tensor)
    return InferRequest(model_name="add_sub", infer_inputs=inputs, request_id=request_id)


def _outputs(response) -> dict[str, np.ndarray]:
    return {output.name: output.as_numpy() for output in response.outputs}


def test_rest_health_reads_the_v2_bodies(server):
    async def call():
        client = InferenceRESTClient(RESTConfig(protocol="v2"))
        try:
            base = f"http://{server.url}"
            return (
                await client.is_server_live(base),
                await client.is_server_ready(base),
                await client.is_model_ready(base, "add_sub"),
            )
        finally:
            await client._client.aclose()

    assert _run(call) == (True, True, True)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_rest_infer(server, binary):
    async def call():
        client = InferenceRESTClient(RESTConfig(protocol="v2"))
        try:
            request = _add_sub_request(binary, "kserve-rest-1")
            return await client.infer(f"http://{server.url}", request, model_name="add_sub")
        finally:
            await client._client.aclose()

    response = _run(call)
    assert response.id == "kserve-rest-1"
    outputs = _outputs(response)
    np.testing.assert_array_equal(outputs["OUTPUT0"], np.array([1.5, 2.5, 4.0, 12.0], np.float32))
    np.testing.assert_array_equal(outputs["OUTPUT1"], np.array([0.5, 1.5, 2.0, -4.0], np.float32))


def test_rest_bytes_tensor(server):
    async def call():
        client = InferenceRESTClient(RESTConfig(protocol="v2"))
        try:
            tensor = InferInput("IN_STRING", [3], "BYTES")
            tensor.set_data_from_numpy(np.array([b"a", b"", b"xyz"], dtype=object), True)
            request = InferRequest(model_name="identity", infer_inputs=[tensor])
            return await client.infer(f"http://{server.url}", request, model_name="identity")
        finally:
            await client._client.aclose()

    outputs = _outputs(_run(call))
    assert [str(v) for v in outputs["OUT_STRING"]] == ["a", "", "xyz"]


def test_rest_error_names_the_model(server):
    async def call():
        client = InferenceRESTClient(RESTConfig(protocol="v2"))
        try:
            request = _add_sub_request(True, "")
            await client.infer(f"http://{server.url}", request, model_name="no_such_model")
        finally:
            await client._client.aclose()

    with pytest.raises(httpx.HTTPStatusError) as caught:
        _run(call)
    assert "no_such_model" in str(caught.value)
    assert caught.value.response.status_code == 404


def test_grpc_health_and_infer(server):
    async def call():
        client = InferenceGRPCClient(server.grpc_url, timeout=30)
        try:
            health = (
                await client.is_server_live(),
                await client.is_server_ready(),
                await client.is_model_ready("add_sub"),
            )
            response = await client.infer(_add_sub_request(True, "kserve-grpc-1"))
            return health, response
        finally:
            await client.close()

    health, response = _run(call)
    assert health == (True, True, True)
    assert response.id == "kserve-grpc-1"
    outputs = _outputs(response)
    np.testing.assert_array_equal(outputs["OUTPUT0"], np.array([1.5, 2.5, 4.0, 12.0], np.float32))
    np.testing.assert_array_equal(outputs["OUTPUT1"], np.array([0.5, 1.5, 2.0, -4.0], np.float32))


def test_grpc_error_names_the_model(server):
    async def call():
        client = InferenceGRPCClient(server.grpc_url, timeout=30, retries=0)
        try:
            request = _add_sub_request(True, "")
            request.model_name = "no_such_model"
            await client.infer(request)
        finally:
            await client.close()

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        _run(call)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no_such_model" in (caught.value.details() or "")
