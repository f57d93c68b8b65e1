"""Requests relayed by frontend workers (checked, staged and packed there) answer as the core's
own path does: the same errors word for word and status for status, the same results, and a
model reloaded under a worker's snapshot is checked against its new configuration."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer
from tests.integration.test_frontend_workers import through

pytestmark = pytest.mark.timeout(120)

MODELS = ("identity", "add_sub", "string_upper", "slow_echo")


def _serve(workers: str) -> ShoalServer:
    args = ["--frontend-workers", workers, "--model-control-mode", "explicit"]
    for name in MODELS:
        args += ["--load-model", name]
    return ShoalServer(BUNDLED, TEST_MODELS, extra_args=tuple(args))


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[ShoalServer, ShoalServer]]:
    with _serve("1") as alone, _serve("2") as relayed:
        yield alone, relayed
        assert "Traceback" not in relayed.output, relayed.output


def _tensor(module, name: str, array: np.ndarray, datatype: str, shape=None):
    tensor = module.InferInput(name, list(array.shape if shape is None else shape), datatype)
    if datatype == "BYTES":
        tensor.set_data_from_numpy(array)
    else:
        tensor.set_data_from_numpy(array.astype(np.float16) if datatype == "FP16" else array)
    return tensor


def _fp32(module, name: str, count: int):
    return _tensor(module, name, np.arange(count, dtype=np.float32), "FP32")


def _strings(module, count: int, batch: int = 1):
    array = np.array([[f"s{i}".encode() for i in range(count)]] * batch, dtype=object)
    return _tensor(module, "TEXT", array, "BYTES")


def _cases(module) -> list[tuple[str, list, list[str]]]:
    """(model, inputs, outputs) of requests the core refuses, and a few it takes."""
    return [
        ("add_sub", [_fp32(module, "INPUT0", 4), _fp32(module, "INPUT1", 4)], []),
        ("add_sub", [_fp32(module, "INPUT0", 4), _fp32(module, "INPUT1", 4)], ["OUTPUT1"]),
        ("add_sub", [_fp32(module, "INPUT0", 4)], []),  # missing
        ("add_sub", [_fp32(module, "INPUT0", 5), _fp32(module, "INPUT1", 4)], []),  # shape
        ("add_sub", [_fp32(module, "INPUT0", 4), _fp32(module, "NOPE", 4)], []),  # unknown
        (  # datatype
            "add_sub",
            [_tensor(module, "INPUT0", np.ones(4), "FP16"), _fp32(module, "INPUT1", 4)],
            [],
        ),
        ("add_sub", [_fp32(module, "INPUT0", 4), _fp32(module, "INPUT1", 4)], ["NOPE"]),
        (  # given twice
            "add_sub",
            [_fp32(module, "INPUT0", 4), _fp32(module, "INPUT0", 4), _fp32(module, "INPUT1", 4)],
            [],
        ),
        ("string_upper", [_strings(module, 3, batch=2)], []),
        ("string_upper", [_strings(module, 3, batch=9)], []),  # batch too large
        ("string_upper", [_tensor(module, "TEXT", np.array([b"x"], dtype=object), "BYTES")], []),
        ("identity", [_fp32(module, "IN_FP32", 16), _fp32(module, "IN_FP32", 16)], []),
        ("identity", [_fp32(module, "IN_FP32", 16)], ["OUT_FP32"]),
        ("nope", [_fp32(module, "IN_FP32", 16)], []),
    ]


def _outcome(module, url: str, model: str, inputs: list, outputs: list[str]):
    client = module.InferenceServerClient(url)
    try:
        requested = [module.InferRequestedOutput(name) for name in outputs] or None
        result = client.infer(model, inputs, outputs=requested)
        names = outputs or [o["name"] for o in _outputs(result)]
        return {name: result.as_numpy(name).tolist() for name in names}
    except InferenceServerException as error:
        return ("error", error.status(), error.message())
    finally:
        client.close()


def _outputs(result) -> list[dict]:
    response = result.get_response()
    if isinstance(response, dict):
        return response["outputs"]
    return [{"name": o.name} for o in response.outputs]


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_errors_and_results_are_the_core_s_through_a_worker(servers, module):
    alone, relayed = servers
    for model, inputs, outputs in _cases(module):
        url_alone = alone.url if module is httpclient else alone.grpc_url
        url_relayed = relayed.url if module is httpclient else relayed.grpc_url
        expected = _outcome(module, url_alone, model, inputs, outputs)
        got = _outcome(module, url_relayed, model, inputs, outputs)
        assert got == expected, (model, [i.name() for i in inputs], outputs)


def _raw(url: str, model: str, header: dict, binary: bytes) -> tuple[int, str]:
    body = json.dumps(header).encode()
    request = urllib.request.Request(
        f"http://{url}/v2/models/{model}/infer",
        data=body + binary,
        headers={"Inference-Header-Content-Length": str(len(body))},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_byte_sizes_and_malformed_strings_are_refused_in_the_core_s_words(servers):
    alone, relayed = servers
    fp32 = {"datatype": "FP32", "shape": [4]}
    cases = [
        (  # 15 bytes for 16
            "add_sub",
            {
                "inputs": [
                    {"name": "INPUT0", **fp32, "parameters": {"binary_data_size": 15}},
                    {"name": "INPUT1", **fp32, "parameters": {"binary_data_size": 16}},
                ]
            },
            b"\0" * 31,
        ),
        (  # a length prefix past the end
            "string_upper",
            {
                "inputs": [
                    {
                        "name": "TEXT",
                        "datatype": "BYTES",
                        "shape": [1, 1],
                        "parameters": {"binary_data_size": 6},
                    }
                ]
            },
            b"\x09\0\0\0ab",
        ),
        (  # one string where the shape says two
            "string_upper",
            {
                "inputs": [
                    {
                        "name": "TEXT",
                        "datatype": "BYTES",
                        "shape": [1, 2],
                        "parameters": {"binary_data_size": 6},
                    }
                ]
            },
            bytes(serialize_byte_tensor(np.array([b"ab"], dtype=object))),
        ),
    ]
    for model, header, binary in cases:
        expected = _raw(alone.url, model, header, binary)
        assert expected[0] == 400, expected
        assert _raw(relayed.url, model, header, binary) == expected


def test_inputs_past_the_inline_budget_reach_the_model_intact(servers):
    _, relayed = servers
    for count in (1, 1000, 5000, 40000):  # inline; in a worker block below and above 32 KiB
        data = np.random.default_rng(count).random(count, dtype=np.float32)
        for module, url in ((httpclient, relayed.url), (grpcclient, relayed.grpc_url)):
            client = module.InferenceServerClient(url)
            try:
                tensor = module.InferInput("IN_FP32", [count], "FP32")
                tensor.set_data_from_numpy(data)
                result = client.infer("identity", [tensor])
                np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), data)
            finally:
                client.close()


def _add_sub(client: httpclient.InferenceServerClient, count: int) -> np.ndarray | str:
    a, b = np.arange(count, dtype=np.float32), np.ones(count, np.float32)
    inputs = [_fp32(httpclient, "INPUT0", count), _fp32(httpclient, "INPUT1", count)]
    inputs[1].set_data_from_numpy(b)
    try:
        result = client.infer("add_sub", inputs)
    except InferenceServerException as error:
        return error.message()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    return result.as_numpy("OUTPUT1")


@contextlib.contextmanager
def _client_of(server: ShoalServer, index: int) -> Iterator[httpclient.InferenceServerClient]:
    """An HTTP client connected through worker ``index``."""
    with through(server, index):
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_server_live()
    try:
        yield client
    finally:
        client.close()


def test_a_reloaded_model_is_checked_against_its_new_config_by_every_worker():
    args = ("--frontend-workers", "2", "--model-control-mode", "explicit", "--load-model")
    with ShoalServer(BUNDLED, extra_args=(*args, "add_sub")) as server:
        for index in (0, 1):  # each worker relays add_sub with its snapshot of [4]
            with _client_of(server, index) as through_worker:
                assert isinstance(_add_sub(through_worker, 4), np.ndarray)
        client = httpclient.InferenceServerClient(server.url)
        try:
            config = client.get_model_config("add_sub")
            for tensor in (*config["input"], *config["output"]):
                tensor["dims"] = [2]
            client.load_model("add_sub", config=json.dumps(config))
        finally:
            client.close()
        for index in (0, 1):  # a stale snapshot is not used: the core checks it, then anew
            with _client_of(server, index) as through_worker:
                message = _add_sub(through_worker, 4)
                assert message == (
                    "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model "
                    "'add_sub'. Expected [2], got [4]. "
                ), message
                assert isinstance(_add_sub(through_worker, 2), np.ndarray)
                assert isinstance(_add_sub(through_worker, 4), str)


def _echo(client: httpclient.InferenceServerClient, data: np.ndarray) -> np.ndarray:
    tensor = httpclient.InferInput("IN_FP32", [data.size], "FP32")
    tensor.set_data_from_numpy(data)
    return client.infer("identity", [tensor]).as_numpy("OUT_FP32")


def test_a_stale_call_s_staged_blocks_carry_it_the_core_s_way():
    """After a reload, a large input the worker staged for a packed call is sent again as a
    placed input of the core's own path, intact."""
    args = ("--frontend-workers", "2", "--model-control-mode", "explicit", "--load-model")
    with ShoalServer(BUNDLED, extra_args=(*args, "identity")) as server:
        data = np.random.default_rng(7).random(40000, dtype=np.float32)  # 160 KB: a block
        for index in (0, 1):
            with _client_of(server, index) as through_worker:
                np.testing.assert_array_equal(_echo(through_worker, data), data)
        client = httpclient.InferenceServerClient(server.url)
        try:
            config = client.get_model_config("identity")
            config["parameters"] = {"reloaded": {"string_value": "yes"}}
            client.load_model("identity", config=json.dumps(config))
        finally:
            client.close()
        for index in (0, 1):
            with _client_of(server, index) as through_worker:
                reversed_data = data[::-1].copy()
                np.testing.assert_array_equal(_echo(through_worker, reversed_data), reversed_data)
                np.testing.assert_array_equal(_echo(through_worker, data), data)
