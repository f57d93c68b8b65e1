"""Triton's naming conventions and tensor rules for TorchScript models (no torch needed)."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.stub.backends._config import BackendModelError, ConfigTensor
from shoal.stub.backends._torch_io import (
    Argument,
    Convention,
    TorchModelError,
    check_argument_types,
    check_datatypes,
    check_indices,
    check_strings,
    map_inputs,
    map_outputs,
    named_index,
    strings_in,
    strings_out,
)
from shoal.stub.backends._torch_options import read_options

TENSORS = [Argument("x", "TensorType", "Tensor"), Argument("y", "TensorType", "Tensor")]


def spec(name: str, datatype: str, dims=(4,), reshape=None) -> ConfigTensor:
    model_dims = tuple(reshape) if reshape is not None else tuple(dims)
    return ConfigTensor(name, datatype, tuple(dims), model_dims, reshape is not None)


def test_named_index():
    assert named_index("INPUT__0") == 0
    assert named_index("my__input__12") == 12
    assert named_index("INPUT_0") is None
    assert named_index("INPUT__x") is None


def test_forward_argument_names_come_first():
    mapping = map_inputs("m", ["y", "x"], TENSORS)
    assert mapping.convention is Convention.FORWARD_ARGUMENT
    assert mapping.index == {"y": 1, "x": 0}


def test_index_style_when_names_are_not_arguments():
    mapping = map_inputs("m", ["INPUT__1", "INPUT__0"], TENSORS)
    assert mapping.convention is Convention.NAMED_INDEX
    assert mapping.index == {"INPUT__1": 1, "INPUT__0": 0}
    outputs = map_outputs("m", ["OUT__1", "OUT__0"])
    assert outputs.convention is Convention.NAMED_INDEX and outputs.index["OUT__1"] == 1


def test_configuration_order_otherwise():
    mapping = map_inputs("m", ["B", "A"], TENSORS)
    assert mapping.convention is Convention.CONFIG_ORDER
    assert mapping.index == {"B": 0, "A": 1}
    assert map_outputs("m", ["sum", "OUT__1"]).index == {"sum": 0, "OUT__1": 1}


def test_a_single_dict_argument_takes_every_input_by_name():
    mapping = map_inputs("m", ["a", "b", "c"], [Argument("inputs", "DictType")])
    assert mapping.convention is Convention.DICTIONARY
    check_indices("m", "input", mapping, 1)  # the dictionary is one argument


def test_input_count_must_match_forward():
    with pytest.raises(TorchModelError, match="configuration expects 1 inputs, model provides 2"):
        map_inputs("m", ["x"], TENSORS)


def test_unsupported_argument_types_are_refused():
    arguments = [Argument("x", "TensorType"), Argument("k", "IntType", "int")]
    with pytest.raises(TorchModelError, match="'m': forward\\(\\) argument 'k' has type int"):
        map_inputs("m", ["x", "k"], arguments)


def test_indices_must_be_distinct_and_in_range():
    with pytest.raises(TorchModelError, match="'A__0' and 'B__0' both have index 0"):
        map_outputs("m", ["A__0", "B__0"])
    mapping = map_inputs("m", ["INPUT__0", "INPUT__2"], TENSORS)
    with pytest.raises(TorchModelError, match="input 'INPUT__2' has index 2"):
        check_indices("m", "input", mapping, 2)


def test_datatypes_without_a_torch_dtype_are_refused():
    check_datatypes("m", "input", [spec("a", "FP32"), spec("b", "BYTES"), spec("c", "BF16")])
    with pytest.raises(TorchModelError, match="unsupported datatype TYPE_UINT32 for input 'u'"):
        check_datatypes("m", "input", [spec("u", "UINT32")])


def test_strings_have_one_dimension_in_all():
    check_strings("m", "input", [spec("s", "BYTES", dims=(-1,))], 0)
    check_strings("m", "input", [spec("s", "BYTES", dims=(1,), reshape=())], 8)
    with pytest.raises(TorchModelError, match="'s' is TYPE_STRING with 2 dimensions"):
        check_strings("m", "input", [spec("s", "BYTES", dims=(2,))], 8)
    with pytest.raises(TorchModelError, match="1-dimensional List\\[str\\]"):
        check_strings("m", "output", [spec("s", "BYTES", dims=(2, 2))], 0)


def test_string_inputs_need_a_list_argument():
    arguments = [Argument("words", "ListType", "List[str]"), Argument("x", "TensorType")]
    inputs = [spec("words", "BYTES", dims=(-1,)), spec("x", "FP32")]
    mapping = map_inputs("m", ["words", "x"], arguments)
    check_argument_types("m", inputs, mapping, arguments)
    swapped = map_inputs("m", ["IN__1", "IN__0"], arguments)
    with pytest.raises(TorchModelError, match="input 'IN__1' \\(TYPE_STRING\\) goes to forward"):
        check_argument_types("m", [spec("IN__1", "BYTES", dims=(-1,))], swapped, arguments)


def test_strings_in_and_out():
    words = np.array([b"caf\xc3\xa9", b"x"], dtype=np.object_)
    assert strings_in("s", words) == ["caf\u00e9", "x"]
    with pytest.raises(TorchModelError, match="input 's' holds bytes that are not UTF-8"):
        strings_in("s", np.array([b"\xff"], dtype=np.object_))
    out = strings_out(["caf\u00e9", "x"])
    assert out.dtype == np.object_ and out.tolist() == [b"caf\xc3\xa9", b"x"]


def test_options_follow_tritons_parameters(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert read_options({}, "m").intra_op_threads == 3
    parameters = {
        "DISABLE_OPTIMIZED_EXECUTION": {"string_value": "true"},
        "INFERENCE_MODE": {"string_value": "true"},
        "ENABLE_CACHE_CLEANING": {"string_value": "false"},
        "INTRA_OP_THREAD_COUNT": {"string_value": "2"},
        "ENABLE_TENSOR_FUSER": {"string_value": "false"},
        "ENABLE_NVFUSER": {"string_value": "true"},
    }
    options = read_options({"parameters": parameters}, "m")
    assert not options.optimized_execution
    assert options.inference_mode and not options.cache_cleaning
    assert options.intra_op_threads == 2
    assert options.jit_switches == (("ENABLE_TENSOR_FUSER", False),)
    bad = {"parameters": {"INTER_OP_THREAD_COUNT": {"string_value": "many"}}}
    with pytest.raises(BackendModelError, match="INTER_OP_THREAD_COUNT must be an int"):
        read_options(bad, "m")
