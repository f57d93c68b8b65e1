import json

import numpy as np
import pytest

from shoal.perf.tensors import (
    TensorInfo,
    concrete_shape,
    parse_input_spec,
    random_tensor,
    split_bytes,
    tensors_from_json,
    tensors_from_metadata,
)

pytestmark = pytest.mark.timeout(10)


def test_input_spec():
    assert parse_input_spec("INPUT0:fp32:1,16") == ("INPUT0", "FP32", (1, 16))
    assert parse_input_spec("a:b:INT8:4") == ("a:b", "INT8", (4,))  # the name may hold colons
    assert parse_input_spec("S:BYTES:") == ("S", "BYTES", ())


@pytest.mark.parametrize("text", ["INPUT0", "X:FP33:4", "X:FP32:a", "X:FP32:-1", ":FP32:4"])
def test_bad_input_specs(text):
    with pytest.raises(ValueError):
        parse_input_spec(text)


def test_concrete_shape_fills_variable_dims_to_a_payload():
    assert concrete_shape([-1], "FP32", 64, batched=False) == (16,)
    assert concrete_shape([-1, -1], "FP32", 64, batched=True) == (1, 16)
    assert concrete_shape([4, -1], "INT64", 64, batched=False) == (4, 2)
    assert concrete_shape([-1], "FP32", None, batched=False) == (1,)
    assert concrete_shape([4], "FP32", 1024, batched=False) == (4,)  # fixed shapes stay


def test_tensors_from_metadata_have_the_asked_size():
    infos = [TensorInfo("INPUT0", "FP32", (-1,)), TensorInfo("INPUT1", "FP32", (-1,))]
    tensors = tensors_from_metadata(infos, 4 * 1024 * 1024, batched=False)
    assert [t.nbytes for t in tensors] == [4 * 1024 * 1024] * 2
    assert tensors[0].data != tensors[1].data  # each input has its own seed


def test_random_data_is_reproducible_and_small_for_integers():
    first, second = random_tensor("C", "INT32", (100,)), random_tensor("C", "INT32", (100,))
    assert first == second
    values = np.frombuffer(first.data, dtype="<i4")
    assert values.min() >= 1 and values.max() <= 8


def test_bytes_tensors_use_the_binary_layout():
    tensor = random_tensor("S", "BYTES", (2,))
    assert split_bytes(tensor.data) == [b"shoal-perf", b"shoal-perf"]
    assert tensor.json_data() == ["shoal-perf", "shoal-perf"]


def test_tensors_from_a_v2_json_body(tmp_path):
    path = tmp_path / "inputs.json"
    path.write_text(
        json.dumps(
            {
                "inputs": [
                    {"name": "COUNT", "datatype": "INT32", "shape": [1], "data": [32]},
                    {"name": "X", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
                    {"name": "S", "datatype": "BYTES", "shape": [1], "data": ["hi"]},
                ]
            }
        )
    )
    count, x, s = tensors_from_json(path)
    assert count.data == np.array([32], dtype="<i4").tobytes()
    assert x.shape == (2, 2) and x.json_data() == [1.0, 2.0, 3.0, 4.0]
    assert split_bytes(s.data) == [b"hi"]


def test_a_json_file_without_inputs_is_refused(tmp_path):
    path = tmp_path / "inputs.json"
    path.write_text('{"inputs": []}')
    with pytest.raises(ValueError):
        tensors_from_json(path)
