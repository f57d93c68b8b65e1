"""Triton's JSON form of a configuration, and back."""

from __future__ import annotations

import json

import pytest

from shoal.config import ConfigError, config_to_json, json_to_config, load_model_config
from shoal.protos import model_config_pb2 as pb

from .helpers import ADD_SUB, ENSEMBLE, SEQUENCE, make_model

# What Triton prints for this config.pbtxt once it has completed it (key order included):
#   max_batch_size: 4
#   input { name: "PROMPT" data_type: TYPE_STRING dims: 1 }
#   output { name: "RESPONSE" data_type: TYPE_STRING dims: 1 }
#   instance_group { count: 1 kind: KIND_CPU }
#   backend: "python"
TRITON_FORM = {
    "name": "chat",
    "platform": "",
    "backend": "python",
    "runtime": "",
    "version_policy": {"latest": {"num_versions": 1}},
    "max_batch_size": 4,
    "input": [
        {
            "name": "PROMPT",
            "data_type": "TYPE_STRING",
            "format": "FORMAT_NONE",
            "dims": [1],
            "is_shape_tensor": False,
            "allow_ragged_batch": False,
            "optional": False,
            "is_non_linear_format_io": False,
        }
    ],
    "output": [
        {
            "name": "RESPONSE",
            "data_type": "TYPE_STRING",
            "dims": [1],
            "label_filename": "",
            "is_shape_tensor": False,
            "is_non_linear_format_io": False,
        }
    ],
    "batch_input": [],
    "batch_output": [],
    "optimization": {
        "priority": "PRIORITY_DEFAULT",
        "input_pinned_memory": {"enable": True},
        "output_pinned_memory": {"enable": True},
        "gather_kernel_buffer_threshold": 0,
        "eager_batching": False,
    },
    "instance_group": [
        {
            "name": "chat_0",
            "kind": "KIND_CPU",
            "count": 1,
            "gpus": [],
            "secondary_devices": [],
            "profile": [],
            "passive": False,
            "host_policy": "",
        }
    ],
    "default_model_filename": "model.py",
    "cc_model_filenames": {},
    "metric_tags": {},
    "parameters": {},
    "model_warmup": [],
}

CHAT = """
max_batch_size: 4
input { name: "PROMPT" data_type: TYPE_STRING dims: 1 }
output { name: "RESPONSE" data_type: TYPE_STRING dims: 1 }
instance_group { count: 1 kind: KIND_CPU }
backend: "python"
"""


def test_matches_what_triton_prints(tmp_path):
    form = config_to_json(load_model_config(make_model(tmp_path, "chat", CHAT)))
    assert form == TRITON_FORM
    assert list(form) == list(TRITON_FORM)
    assert list(form["input"][0]) == list(TRITON_FORM["input"][0])
    assert json.loads(json.dumps(form)) == form


def test_keys_python_models_read(tmp_path):
    form = config_to_json(load_model_config(make_model(tmp_path, "add_sub", ADD_SUB)))
    assert form["max_batch_size"] == 8
    assert form["input"][0]["dims"] == [4]
    assert form["output"][1]["data_type"] == "TYPE_FP32"
    assert form["parameters"]["mode"]["string_value"] == "fast"
    assert form["instance_group"][0]["kind"] == "KIND_CPU"
    batching = form["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 100
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 5_000_000
    assert batching["priority_queue_policy"]["1"]["timeout_action"] == "DELAY"
    assert batching["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 100
    assert "sequence_batching" not in form and "ensemble_scheduling" not in form
    assert "model_transaction_policy" not in form  # unset messages are left out


def _ints_are_numbers(value, where="config"):
    if isinstance(value, dict):
        for key, item in value.items():
            _ints_are_numbers(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _ints_are_numbers(item, f"{where}[{index}]")
    else:
        assert not (isinstance(value, str) and value.lstrip("-").isdigit()), where


def test_every_64_bit_integer_is_a_json_number():
    config = pb.ModelConfig()
    config.version_policy.specific.versions.extend([1, 3])
    config.input.add(name="I", dims=[-1, 3], reshape=pb.ModelTensorReshape(shape=[3, -1]))
    config.output.add(name="O", dims=[2])
    config.sequence_batching.max_sequence_idle_microseconds = 10**12
    config.sequence_batching.oldest.max_queue_delay_microseconds = 5
    state = config.sequence_batching.state.add(dims=[4])
    state.initial_state.add(dims=[4], zero_data=True)
    group = config.instance_group.add()
    group.secondary_devices.add(device_id=2)
    warmup = config.model_warmup.add(name="w")
    warmup.inputs["I"].dims.extend([1, 3])
    warmup.inputs["I"].zero_data = True
    graph = config.optimization.cuda.graph_spec.add()
    graph.input["I"].dim.extend([8, 3])
    graph.graph_lower_bound.input["I"].dim.extend([1, 3])

    form = config_to_json(config)

    _ints_are_numbers(form)
    assert form["version_policy"]["specific"]["versions"] == [1, 3]
    assert form["input"][0]["reshape"]["shape"] == [3, -1]
    assert form["sequence_batching"]["max_sequence_idle_microseconds"] == 10**12
    assert form["sequence_batching"]["state"][0]["initial_state"][0]["dims"] == [4]
    assert form["instance_group"][0]["secondary_devices"][0]["device_id"] == 2
    assert form["model_warmup"][0]["inputs"]["I"]["dims"] == [1, 3]
    assert form["optimization"]["cuda"]["graph_spec"][0]["input"]["I"]["dim"] == [8, 3]


def test_floats_print_like_triton():
    config = pb.ModelConfig()
    control = config.sequence_batching.control_input.add(name="S").control.add()
    control.fp32_false_true.extend([0.0, 1.0])
    config.sequence_batching.direct.minimum_slot_utilization = 0.5
    form = config_to_json(config)
    values = form["sequence_batching"]["control_input"][0]["control"][0]["fp32_false_true"]
    assert values == [0, 1] and all(type(v) is int for v in values)
    assert form["sequence_batching"]["direct"]["minimum_slot_utilization"] == 0.5


@pytest.mark.parametrize(
    ("name", "text"),
    [("add_sub", ADD_SUB), ("accumulate", SEQUENCE), ("pipeline", ENSEMBLE), ("chat", CHAT)],
)
def test_round_trip(tmp_path, name, text):
    config = load_model_config(make_model(tmp_path, name, text))
    form = config_to_json(config)
    again = json_to_config(json.loads(json.dumps(form)))
    assert again == config.proto
    assert config_to_json(again) == form


def test_typed_config_and_message_give_the_same_form(tmp_path):
    config = load_model_config(make_model(tmp_path, "add_sub", ADD_SUB))
    assert config_to_json(config) == config_to_json(config.proto)


def test_json_to_config_accepts_strings_for_64_bit_ints_and_any_enum_case():
    config = json_to_config(
        {
            "name": "m",
            "input": [{"name": "I", "data_type": "type_fp32", "dims": ["-1", 4]}],
            "instance_group": [{"kind": "kind_cpu", "count": 2}],
            "dynamic_batching": {
                "max_queue_delay_microseconds": "100",
                "priority_queue_policy": {"1": {"timeout_action": "delay"}},
            },
            "parameters": {"k": {"string_value": "v"}},
        }
    )
    assert config.input[0].data_type == pb.TYPE_FP32
    assert list(config.input[0].dims) == [-1, 4]
    assert config.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert (
        config.dynamic_batching.priority_queue_policy[1].timeout_action == pb.ModelQueuePolicy.DELAY
    )
    assert config.parameters["k"].string_value == "v"


def test_json_to_config_rejects_unknown_fields():
    with pytest.raises(ConfigError, match="does not fit ModelConfig") as info:
        json_to_config({"name": "m", "inputs": []})
    assert "inputs" in info.value.message
    assert "shoal.inference" not in info.value.message


def test_json_to_config_rejects_wrong_types():
    with pytest.raises(ConfigError, match="max_batch_size"):
        json_to_config({"max_batch_size": "lots"})
    with pytest.raises(ConfigError, match="must be a JSON object"):
        json_to_config([1, 2])  # type: ignore[arg-type]


def test_json_to_config_takes_one_element_for_a_repeated_field():
    # Triton's parser (protobuf's JsonStringToMessage, legacy syntax) reads a lone element of a
    # repeated field as a list of one; L0_lifecycle loads with "instance_group": {...}.
    config = json_to_config(
        {
            "instance_group": {"kind": "kind_cpu", "count": 5},
            "input": {"name": "I", "data_type": "TYPE_FP32", "dims": 4},
            "output": [{"name": "O", "data_type": "TYPE_FP32", "dims": [4]}],
        }
    )
    assert len(config.instance_group) == 1
    assert config.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU
    assert config.instance_group[0].count == 5
    assert [i.name for i in config.input] == ["I"]
    assert list(config.input[0].dims) == [4]
    assert list(config.output[0].dims) == [4]
    # a map is not a repeated field: it still takes an object only
    with pytest.raises(ConfigError, match="parameters"):
        json_to_config({"parameters": [{"k": {"string_value": "v"}}]})
