"""ModelConfig: the auto_complete_config API and its ValueError rules."""

from __future__ import annotations

import json

import pytest

from shoal.stub.pb_utils import ModelConfig


def config(**fields):
    return ModelConfig(json.dumps({"name": "m", **fields}))


def test_parses_json_and_returns_the_live_dict():
    model_config = config(max_batch_size=4)
    as_dict = model_config.as_dict()
    assert as_dict["max_batch_size"] == 4
    as_dict["extra"] = 1
    assert model_config.as_dict()["extra"] == 1
    assert model_config._model_config is as_dict


def test_accepts_a_dict():
    raw = {"name": "m"}
    assert ModelConfig(raw).as_dict() is raw


# -- max_batch_size --------------------------------------------------------------------------


def test_set_max_batch_size_when_unset_or_smaller():
    model_config = config()
    model_config.set_max_batch_size(8)
    assert model_config.as_dict()["max_batch_size"] == 8
    model_config.set_max_batch_size(16)
    assert model_config.as_dict()["max_batch_size"] == 16


def test_set_max_batch_size_equal_is_fine():
    model_config = config(max_batch_size=4)
    model_config.set_max_batch_size(4)
    assert model_config.as_dict()["max_batch_size"] == 4


def test_set_max_batch_size_below_configured_raises():
    with pytest.raises(ValueError, match="max_batch_size 8"):
        config(max_batch_size=8).set_max_batch_size(4)


@pytest.mark.parametrize("value", [-1, "4", 2.0, True])
def test_set_max_batch_size_rejects_bad_values(value):
    with pytest.raises(ValueError):
        config().set_max_batch_size(value)


# -- dynamic batching ------------------------------------------------------------------------


def test_set_dynamic_batching_adds_an_empty_section():
    model_config = config()
    model_config.set_dynamic_batching()
    assert model_config.as_dict()["dynamic_batching"] == {}


def test_set_dynamic_batching_keeps_existing_settings():
    model_config = config(dynamic_batching={"max_queue_delay_microseconds": 100})
    model_config.set_dynamic_batching()
    assert model_config.as_dict()["dynamic_batching"] == {"max_queue_delay_microseconds": 100}


@pytest.mark.parametrize("scheduler", ["sequence_batching", "ensemble_scheduling"])
def test_set_dynamic_batching_conflicts_with_other_schedulers(scheduler):
    with pytest.raises(ValueError, match=scheduler):
        config(**{scheduler: {}}).set_dynamic_batching()


# -- inputs and outputs ----------------------------------------------------------------------


def test_add_input_appends():
    model_config = config()
    spec = {"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True}
    model_config.add_input(spec)
    assert model_config.as_dict()["input"] == [spec]


def test_add_output_appends_to_existing_list():
    model_config = config(output=[{"name": "A", "data_type": "TYPE_INT32", "dims": [1]}])
    model_config.add_output({"name": "B", "data_type": "TYPE_STRING", "dims": [-1]})
    assert [o["name"] for o in model_config.as_dict()["output"]] == ["A", "B"]


@pytest.mark.parametrize("missing", ["name", "data_type", "dims"])
@pytest.mark.parametrize("method", ["add_input", "add_output"])
def test_required_properties(method, missing):
    spec = {"name": "X", "data_type": "TYPE_FP32", "dims": [1]}
    del spec[missing]
    with pytest.raises(ValueError, match=missing):
        getattr(config(), method)(spec)


def test_unknown_input_property_raises():
    with pytest.raises(ValueError, match="format"):
        config().add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1], "format": 1})


def test_optional_is_not_an_output_property():
    with pytest.raises(ValueError, match="optional"):
        config().add_output({"name": "X", "data_type": "TYPE_FP32", "dims": [1], "optional": True})


@pytest.mark.parametrize("method", ["add_input", "add_output"])
def test_spec_must_be_a_dict(method):
    with pytest.raises(ValueError):
        getattr(config(), method)([("name", "X")])


def test_merge_fills_an_existing_entry():
    model_config = config(input=[{"name": "IN", "data_type": "TYPE_INVALID", "dims": []}])
    model_config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [3]})
    assert model_config.as_dict()["input"] == [
        {"name": "IN", "data_type": "TYPE_FP32", "dims": [3]}
    ]


def test_merge_same_values_is_fine():
    model_config = config(output=[{"name": "OUT", "data_type": "TYPE_FP32", "dims": [3]}])
    model_config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [3]})
    assert len(model_config.as_dict()["output"]) == 1


def test_merge_compares_dims_as_integers():
    model_config = config(input=[{"name": "IN", "data_type": "TYPE_FP32", "dims": ["3"]}])
    model_config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [3]})


@pytest.mark.parametrize("method,kind", [("add_input", "input"), ("add_output", "output")])
def test_merge_conflicting_data_type_raises(method, kind):
    model_config = config(**{kind: [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}]})
    with pytest.raises(ValueError, match="configuration expects datatype TYPE_INT32"):
        getattr(model_config, method)({"name": "X", "data_type": "TYPE_FP32", "dims": [1]})


@pytest.mark.parametrize("method,kind", [("add_input", "input"), ("add_output", "output")])
def test_merge_conflicting_dims_raises(method, kind):
    model_config = config(**{kind: [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}]})
    with pytest.raises(ValueError, match="dims"):
        getattr(model_config, method)({"name": "X", "data_type": "TYPE_FP32", "dims": [3]})


def test_merge_conflicting_optional_raises():
    existing = {"name": "X", "data_type": "TYPE_FP32", "dims": [1], "optional": False}
    model_config = config(input=[existing])
    with pytest.raises(ValueError, match="optional"):
        model_config.add_input(
            {"name": "X", "data_type": "TYPE_FP32", "dims": [1], "optional": True}
        )


def test_merge_sets_optional_when_unset():
    model_config = config(input=[{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}])
    model_config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1], "optional": True})
    assert model_config.as_dict()["input"][0]["optional"] is True


# -- transaction policy ----------------------------------------------------------------------


def test_set_model_transaction_policy():
    model_config = config()
    model_config.set_model_transaction_policy({"decoupled": True})
    assert model_config.as_dict()["model_transaction_policy"] == {"decoupled": True}
    model_config.set_model_transaction_policy({"decoupled": True})


def test_transaction_policy_only_allows_decoupled():
    with pytest.raises(ValueError, match="sequence"):
        config().set_model_transaction_policy({"sequence": True})


def test_transaction_policy_conflict_raises():
    model_config = config(model_transaction_policy={"decoupled": False})
    with pytest.raises(ValueError, match="decoupled"):
        model_config.set_model_transaction_policy({"decoupled": True})


# The Python backend's own words (triton_python_backend_utils.ModelConfig), which Triton's
# L0_model_config autofill_noplatform/python cases match
TRITON_WORDS = [
    (
        lambda c: c.set_max_batch_size(4),
        {"max_batch_size": 6},
        "configuration specified max_batch_size 6, but in auto-complete-config function for "
        "model 'm' specified max_batch_size 4",
    ),
    (
        lambda c: c.set_dynamic_batching(),
        {"sequence_batching": {}},
        "Configuration specified scheduling_choice as 'sequence_batching', but "
        "auto-complete-config function for model 'm' tries to set scheduling_choice as "
        "'dynamic_batching'",
    ),
    (
        lambda c: c.add_input({"name": "I", "dims": [1]}),
        {},
        "input 'I' in auto-complete-config function for model 'm' is missing 'data_type' property.",
    ),
    (
        lambda c: c.add_output({"data_type": "TYPE_FP32", "dims": [1]}),
        {},
        "output in auto-complete-config function for model 'm' is missing 'name' property.",
    ),
    (
        lambda c: c.add_input({"name": "I", "data_type": "TYPE_FP32", "dims": [1], "x": 1}),
        {},
        "input 'I' in auto-complete-config function for model 'm' contains property other "
        "than 'name', 'data_type', 'dims' and 'optional'.",
    ),
    (
        lambda c: c.add_output({"name": "O", "data_type": "TYPE_FP32", "dims": [4]}),
        {"output": [{"name": "O", "data_type": "TYPE_FP32", "dims": [16]}]},
        "model 'm', tensor 'O': the model expects dims [4] but the model configuration "
        "specifies dims [16]",
    ),
    (
        lambda c: c.set_model_transaction_policy({"decoupled": True, "other": 1}),
        {},
        "model transaction property in auto-complete-config function for model 'm' contains "
        "property other than 'decoupled'.",
    ),
    (
        lambda c: c.set_model_transaction_policy({"decoupled": True}),
        {"model_transaction_policy": {"decoupled": False}},
        "trying to change decoupled property in auto-complete-config for model 'm', which is "
        "already set to 'False'.",
    ),
]


@pytest.mark.parametrize(("call", "fields", "words"), TRITON_WORDS)
def test_refusals_start_with_the_python_backends_words(call, fields, words):
    with pytest.raises(ValueError) as info:
        call(config(**fields))
    assert str(info.value).startswith(words)
