"""``shoal perf`` with perf_analyzer's flag names and its ``--input-data`` JSON."""

from __future__ import annotations

import argparse
import base64
import json

import numpy as np
import pytest

from shoal.perf.cli import add_arguments, config_from_args
from shoal.perf.errors import PerfError
from shoal.perf.input_data import tensors_from_data
from shoal.perf.tensors import TensorInfo

pytestmark = pytest.mark.timeout(10)


def _config(*flags: str):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(list(flags)))


def test_perf_analyzer_names_map_to_the_same_run(tmp_path):
    data = tmp_path / "data.json"
    config = _config(
        *("-m", "simple", "-u", "host:9000", "-i", "GRPC", "-b", "4", "-x", "2"),
        *("--concurrency-range", "2:8:3", "--measurement-interval", "2500"),
        *("--input-data", str(data), "--shared-memory", "system"),
    )
    assert (config.model, config.url, config.protocol) == ("simple", "host:9000", "grpc")
    assert (config.batch_size, config.version) == (4, "2")
    assert config.concurrency == (2, 5, 8)
    assert config.duration_s == 2.5
    assert config.input_data == data and config.shared_memory


def test_input_data_random_and_zero():
    assert _config("-m", "m").input_data is None and not _config("-m", "m").zero_data
    zero = _config("-m", "m", "--input-data", "zero")
    assert zero.zero_data and zero.input_data is None


def test_cuda_shared_memory_points_at_perf_analyzer():
    with pytest.raises(PerfError, match="perf_analyzer"):
        _config("-m", "m", "--shared-memory", "cuda")


def test_shoal_names_still_work():
    config = _config("--model", "m", "--concurrency", "1:4", "--duration", "2")
    assert config.concurrency == (1, 2, 4) and config.duration_s == 2.0


def test_perf_analyzer_data_flat_values_take_the_metadata_shape():
    inputs = [TensorInfo("IN", "FP32", (-1, 2)), TensorInfo("TEXT", "BYTES", (-1, -1))]
    document = {"data": [{"IN": [1, 2], "TEXT": {"content": ["a", "bc"], "shape": [2]}}]}
    first, text = tensors_from_data(document, inputs, batch_size=3, batched=True)
    assert first.shape == (3, 2)
    assert np.frombuffer(first.data, "<f4").tolist() == [1, 2] * 3
    assert text.shape == (3, 2)


def test_perf_analyzer_data_b64_and_unbatched():
    raw = np.arange(4, dtype="<i4").tobytes()
    document = {"data": [{"IN": {"b64": base64.b64encode(raw).decode(), "shape": [4]}}]}
    (tensor,) = tensors_from_data(
        document, [TensorInfo("IN", "INT32", (4,))], batch_size=1, batched=False
    )
    assert tensor.shape == (4,) and tensor.data == raw


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"data": []}, "at least one"),
        ({"data": [{"OTHER": [1]}]}, "no input 'IN'"),
        ({"data": [{"IN": [1, 2, 3]}]}, "has 3 values"),
        ({"data": [{"IN": 5}]}, "list of values"),
    ],
)
def test_bad_perf_analyzer_data_is_refused_with_the_reason(document, message):
    with pytest.raises(ValueError, match=message):
        tensors_from_data(
            json.loads(json.dumps(document)),
            [TensorInfo("IN", "FP32", (2,))],
            batch_size=1,
            batched=False,
        )
