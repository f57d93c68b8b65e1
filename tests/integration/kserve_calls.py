"""The KServe SDK's calls against a server, run in a process of their own by test_kserve_sdk.

kserve and tritonclient.grpc both register the KServe V2 protos (package ``inference``) in
protobuf's default descriptor pool: imported into one process, the second import fails. So the
tests run this script and read what it prints: one JSON object, a key per call, each call's
result or the exception it raised.

Usage: python kserve_calls.py HTTP_HOST:PORT GRPC_HOST:PORT
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import httpx
import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig


def _add_sub(binary: bool, request_id: str, model: str = "add_sub") -> InferRequest:
    a = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    b = np.array([0.5, 0.5, 1.0, 8.0], dtype=np.float32)
    inputs = []
    for name, data in (("INPUT0", a), ("INPUT1", b)):
        tensor = InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(data, binary_data=binary)
        inputs.append(tensor)
    return InferRequest(model_name=model, infer_inputs=inputs, request_id=request_id)


def _response(response: Any) -> dict[str, Any]:
    outputs = {o.name: o.as_numpy().tolist() for o in response.outputs}
    return {"id": response.id, "outputs": outputs}


async def _capture(call: Callable[[], Awaitable[Any]]) -> Any:
    try:
        return await call()
    except httpx.HTTPStatusError as error:
        return {"status": error.response.status_code, "message": str(error)}
    except grpc.aio.AioRpcError as error:
        return {"code": error.code().name, "details": error.details()}
    except Exception as error:  # reported to the test, which names it
        return {"exception": repr(error)}


async def _rest(base: str) -> dict[str, Any]:
    client = InferenceRESTClient(RESTConfig(protocol="v2"))
    results: dict[str, Any] = {}
    try:

        async def health() -> list[bool]:
            return [
                await client.is_server_live(base),
                await client.is_server_ready(base),
                await client.is_model_ready(base, "add_sub"),
            ]

        async def infer(binary: bool) -> dict[str, Any]:
            request = _add_sub(binary, "kserve-rest-1")
            return _response(await client.infer(base, request, model_name="add_sub"))

        async def strings() -> dict[str, Any]:
            tensor = InferInput("IN_STRING", [3], "BYTES")
            tensor.set_data_from_numpy(np.array([b"a", b"", b"xyz"], dtype=object), True)
            request = InferRequest(model_name="identity", infer_inputs=[tensor])
            response = await client.infer(base, request, model_name="identity")
            return {o.name: [str(v) for v in o.as_numpy()] for o in response.outputs}

        async def unknown() -> Any:
            request = _add_sub(True, "", "no_such_model")
            return await client.infer(base, request, model_name="no_such_model")

        results["rest_health"] = await _capture(health)
        results["rest_infer_json"] = await _capture(lambda: infer(False))
        results["rest_infer_binary"] = await _capture(lambda: infer(True))
        results["rest_bytes"] = await _capture(strings)
        results["rest_unknown_model"] = await _capture(unknown)
    finally:
        await client._client.aclose()
    return results


async def _grpc(url: str) -> dict[str, Any]:
    client = InferenceGRPCClient(url, timeout=30, retries=0)
    results: dict[str, Any] = {}
    try:

        async def health() -> list[bool]:
            return [
                await client.is_server_live(),
                await client.is_server_ready(),
                await client.is_model_ready("add_sub"),
            ]

        async def infer() -> dict[str, Any]:
            return _response(await client.infer(_add_sub(True, "kserve-grpc-1")))

        async def unknown() -> Any:
            return await client.infer(_add_sub(True, "", "no_such_model"))

        results["grpc_health"] = await _capture(health)
        results["grpc_infer"] = await _capture(infer)
        results["grpc_unknown_model"] = await _capture(unknown)
    finally:
        await client.close()
    return results


async def _main(http_url: str, grpc_url: str) -> dict[str, Any]:
    results = await _rest(f"http://{http_url}")
    results.update(await _grpc(grpc_url))
    return results


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_main(sys.argv[1], sys.argv[2]))))
