"""Raw binary requests (``Inference-Header-Content-Length: 0``): the body is the bytes of the
model's only input, its shape deduced from the configuration as Triton does, every output
answered binary; Triton's errors for the models it cannot deduce an input for. Served on the fast
path and on the ASGI way (a header forward pattern turns the fast path off).

tritonclient has no raw mode (it always sends a JSON header), so the requests are plain HTTP."""

from __future__ import annotations

import gzip
import json
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.integration.server import BUNDLED, ShoalServer

pytestmark = pytest.mark.timeout(180)

#: name -> (max_batch_size, inputs as (name, type, dims)) of a copy of the bundled identity
#: model (OUT_<TYPE> for each IN_<TYPE> it is sent).
MODELS = {
    "raw_batched": (4, [("IN_FP32", "TYPE_FP32", "-1")]),
    "raw_fixed": (0, [("IN_INT32", "TYPE_INT32", "2, -1")]),
    "raw_bytes": (0, [("IN_STRING", "TYPE_STRING", "1")]),
    "raw_string_list": (0, [("IN_STRING", "TYPE_STRING", "-1")]),
    "raw_matrix": (0, [("IN_INT16", "TYPE_INT16", "-1, -1")]),
    "raw_two_inputs": (0, [("IN_FP32", "TYPE_FP32", "-1"), ("IN_INT8", "TYPE_INT8", "-1")]),
}
#: The ASGI server loads only these.
ASGI_MODELS = ("raw_batched", "raw_two_inputs")


def _config(name: str, max_batch_size: int, inputs: list[tuple[str, str, str]]) -> str:
    ins = ", ".join(f'{{ name: "{n}" data_type: {t} dims: [ {d} ] }}' for n, t, d in inputs)
    outs = ", ".join(
        f'{{ name: "OUT_{n[3:]}" data_type: {t} dims: [ {d} ] }}' for n, t, d in inputs
    )
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
        f"input [ {ins} ]\noutput [ {outs} ]\n"
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("raw_requests")
    for name, (max_batch_size, inputs) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(BUNDLED / "identity" / "1" / "model.py", repo / name / "1" / "model.py")
        (repo / name / "config.pbtxt").write_text(_config(name, max_batch_size, inputs))
    return repo


@pytest.fixture(scope="module")
def fast(repo: Path) -> Iterator[str]:
    with ShoalServer(repo) as server:
        yield f"http://{server.url}"


@pytest.fixture(scope="module")
def asgi(repo: Path) -> Iterator[str]:
    flags = ["--model-control-mode=explicit", "--http-header-forward-pattern=fwd-.*"]
    flags += [f"--load-model={name}" for name in ASGI_MODELS]
    with ShoalServer(repo, extra_args=tuple(flags)) as server:
        yield f"http://{server.url}"


@pytest.fixture(params=["fast", "asgi"])
def base(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(request.param))


def _raw(base: str, model: str, body: bytes, **headers: str) -> requests.Response:
    headers = {"Inference-Header-Content-Length": "0", **headers}
    return requests.post(f"{base}/v2/models/{model}/infer", data=body, headers=headers, timeout=30)


def _outputs(reply: requests.Response) -> dict[str, tuple[dict, bytes]]:
    """Each output's JSON entry and its binary bytes; every output must be binary."""
    assert reply.status_code == 200, reply.text
    size = int(reply.headers["Inference-Header-Content-Length"])
    header, offset, found = json.loads(reply.content[:size]), size, {}
    for output in header["outputs"]:
        assert "data" not in output, output
        length = output["parameters"]["binary_data_size"]
        found[output["name"]] = (output, reply.content[offset : offset + length])
        offset += length
    assert offset == len(reply.content)
    return found


def test_a_batching_model_gets_a_batch_of_one(base: str) -> None:
    values = np.arange(5, dtype=np.float32)
    output, data = _outputs(_raw(base, "raw_batched", values.tobytes()))["OUT_FP32"]
    assert output["shape"] == [1, 5] and output["datatype"] == "FP32"
    np.testing.assert_array_equal(np.frombuffer(data, np.float32), values)


def test_a_compressed_raw_body_is_inflated_first(base: str) -> None:
    values = np.arange(3, dtype=np.float32)
    reply = _raw(
        base, "raw_batched", gzip.compress(values.tobytes()), **{"Content-Encoding": "gzip"}
    )
    output, data = _outputs(reply)["OUT_FP32"]
    assert output["shape"] == [1, 3]
    np.testing.assert_array_equal(np.frombuffer(data, np.float32), values)


def test_the_variable_dimension_takes_what_the_size_leaves(fast: str) -> None:
    values = np.arange(6, dtype=np.int32)
    output, data = _outputs(_raw(fast, "raw_fixed", values.tobytes()))["OUT_INT32"]
    assert output["shape"] == [2, 3]
    np.testing.assert_array_equal(np.frombuffer(data, np.int32), values)


def test_a_bytes_input_is_one_element(fast: str) -> None:
    output, data = _outputs(_raw(fast, "raw_bytes", b"hello raw"))["OUT_STRING"]
    assert output["shape"] == [1] and output["datatype"] == "BYTES"
    assert data == struct.pack("<I", 9) + b"hello raw"


def _error(reply: requests.Response) -> str:
    assert reply.status_code == 400, (reply.status_code, reply.text)
    return str(reply.json()["error"])


def test_a_model_with_two_inputs_is_refused(base: str) -> None:
    assert _error(_raw(base, "raw_two_inputs", b"\x00" * 8)) == (
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be "
        "deduced but got 2 inputs in 'raw_two_inputs' model configuration"
    )


def test_two_variable_dimensions_are_refused(fast: str) -> None:
    assert _error(_raw(fast, "raw_matrix", b"\x00" * 8)) == (
        "[request id: <id_unknown>] The shape of the raw input 'IN_INT16' can not be deduced "
        "because there are more than one variable-sized dimension"
    )


def test_a_bytes_input_must_have_shape_one(fast: str) -> None:
    assert _error(_raw(fast, "raw_string_list", b"abc")) == (
        "[request id: <id_unknown>] For BYTE datatype raw input 'IN_STRING', the model must "
        "have input shape [1]"
    )


def test_a_size_that_does_not_divide_is_a_size_mismatch(fast: str) -> None:
    # 10 bytes: 10 // 8 = one column of two INT32, 8 bytes, as Triton's division makes it.
    assert _error(_raw(fast, "raw_fixed", b"\x00" * 10)) == (
        "input byte size mismatch for input 'IN_INT32' for model 'raw_fixed'. Expected 8, got 10"
    )


def test_an_unknown_model_is_answered_as_on_the_json_way(fast: str) -> None:
    raw = _raw(fast, "nope", b"\x00" * 4)
    plain = requests.post(f"{fast}/v2/models/nope/infer", json={"inputs": []}, timeout=30)
    assert (raw.status_code, raw.json()) == (plain.status_code, plain.json()), raw.text
    assert raw.json()["error"] == "Request for unknown model: 'nope' is not found"
