"""Loading realistic model directories into the typed ModelConfig."""

from __future__ import annotations

import dataclasses

import pytest

from shoal.config import (
    ConfigError,
    EnsembleStep,
    InstanceGroupConfig,
    InstanceSpec,
    QueuePolicy,
    SequenceControl,
    TensorConfig,
    complete_config,
    config_to_json,
    load_model_config,
    read_config,
)

from .helpers import ADD_SUB, ENSEMBLE, SEQUENCE, make_model


def test_add_sub_with_dynamic_batching(tmp_path):
    model_dir = make_model(tmp_path, "add_sub", ADD_SUB)
    config = load_model_config(model_dir)

    assert (config.name, config.backend, config.platform) == ("add_sub", "python", "")
    assert config.max_batch_size == 8
    assert config.inputs == (
        TensorConfig("INPUT0", "FP32", (4,)),
        TensorConfig("INPUT1", "FP32", (4,)),
    )
    assert [o.name for o in config.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert config.version_policy == ("latest", 1)
    assert config.default_model_filename == "model.py"
    assert dict(config.parameters) == {
        "EXECUTION_ENV_PATH": "$$TRITON_MODEL_DIRECTORY/env.tar.gz",
        "mode": "fast",
    }
    assert config.decoupled is False
    assert config.sequence_batching is None
    batching = config.dynamic_batching
    assert batching is not None
    assert batching.preferred_batch_sizes == (4, 8)
    assert batching.max_queue_delay_microseconds == 100
    assert (batching.priority_levels, batching.default_priority_level) == (2, 2)
    assert batching.default_queue_policy == QueuePolicy("REJECT", 5_000_000)
    assert dict(batching.priority_queue_policies) == {1: QueuePolicy("DELAY", 100, False, 16)}
    assert config.instance_groups == (InstanceGroupConfig("add_sub_0", "KIND_CPU", 2),)
    assert list(config.instance_names()) == [
        ("add_sub_0_0", "KIND_CPU", 0),
        ("add_sub_0_1", "KIND_CPU", 0),
    ]
    assert config.path == model_dir
    assert config.config_file == model_dir / "config.pbtxt"
    assert config.warnings == ()


def test_sequence_batching_with_controls_and_state(tmp_path):
    config = load_model_config(make_model(tmp_path, "accumulate", SEQUENCE))

    assert config.dynamic_batching is None
    sequence = config.sequence_batching
    assert sequence is not None
    assert sequence.strategy == "oldest"
    assert sequence.max_sequence_idle_microseconds == 5_000_000
    assert sequence.max_candidate_sequences == 4
    assert sequence.preferred_batch_sizes == (2, 4)
    assert sequence.max_queue_delay_microseconds == 100
    assert sequence.controls == (
        SequenceControl("CONTROL_SEQUENCE_START", "START", "FP32", 0.0, 1.0),
        SequenceControl("CONTROL_SEQUENCE_END", "END", "BOOL", False, True),
        SequenceControl("CONTROL_SEQUENCE_READY", "READY", "INT32", 0, 1),
        SequenceControl("CONTROL_SEQUENCE_CORRID", "CORRID", "UINT64"),
    )
    assert sequence.control("CONTROL_SEQUENCE_END") == sequence.controls[1]
    assert sequence.control("nope") is None
    (state,) = sequence.states
    assert (state.input_name, state.output_name, state.datatype, state.dims) == (
        "INPUT_STATE",
        "OUTPUT_STATE",
        "INT32",
        (-1,),
    )
    (initial,) = state.initial_states
    assert (initial.name, initial.zero_data, initial.data_file, initial.dims) == (
        "zeros",
        True,
        None,
        (1,),
    )


def test_sequence_batching_defaults_to_direct_with_one_second_idle(tmp_path):
    config = load_model_config(
        make_model(
            tmp_path,
            "seq",
            """
            backend: "python"
            max_batch_size: 2
            sequence_batching { direct { max_queue_delay_microseconds: 7 } }
            """,
        )
    )
    sequence = config.sequence_batching
    assert sequence is not None
    assert (sequence.strategy, sequence.max_queue_delay_microseconds) == ("direct", 7)
    assert sequence.max_sequence_idle_microseconds == 1_000_000
    assert sequence.controls == ()


def test_ensemble(tmp_path):
    config = load_model_config(make_model(tmp_path, "pipeline", ENSEMBLE, model_file=None))

    assert config.is_ensemble
    assert (config.platform, config.backend, config.default_model_filename) == ("ensemble", "", "")
    assert config.instance_groups == ()
    assert list(config.instance_names()) == []
    assert config.ensemble_steps == (
        EnsembleStep("preprocess", -1, {"TEXT": "RAW"}, {"TOKENS": "tokens"}),
        EnsembleStep("classifier", 2, {"INPUT_IDS": "tokens"}, {"LOGITS": "SCORES"}),
    )
    assert config.inputs[0].datatype == "BYTES"
    assert not config.proto.HasField("optimization")
    # Triton serves an ensemble's configuration with its transaction policy spelled out.
    assert config_to_json(config)["model_transaction_policy"] == {"decoupled": False}


def test_instance_groups_named_and_placed_like_triton(tmp_path):
    model_dir = make_model(
        tmp_path,
        "multi",
        """
        backend: "python"
        instance_group [
          { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] },
          { name: "cpu_pool" kind: KIND_CPU },
          { count: 1 kind: KIND_GPU },
          { kind: KIND_AUTO gpus: [ 1 ] }
        ]
        """,
    )
    config = load_model_config(model_dir, gpus=[1, 0])

    assert config.instance_groups == (
        InstanceGroupConfig("multi_0", "KIND_GPU", 2, (0, 1)),
        InstanceGroupConfig("cpu_pool", "KIND_CPU", 1),
        InstanceGroupConfig("multi_2", "KIND_GPU", 1, (0, 1)),
        InstanceGroupConfig("multi_3", "KIND_GPU", 1, (1,)),
    )
    assert list(config.instance_names()) == [
        InstanceSpec("multi_0_0", "KIND_GPU", 0),
        InstanceSpec("multi_0_0", "KIND_GPU", 1),
        InstanceSpec("multi_0_1", "KIND_GPU", 0),
        InstanceSpec("multi_0_1", "KIND_GPU", 1),
        InstanceSpec("cpu_pool_0", "KIND_CPU", 0),
        InstanceSpec("multi_2_0", "KIND_GPU", 0),
        InstanceSpec("multi_2_0", "KIND_GPU", 1),
        InstanceSpec("multi_3_0", "KIND_GPU", 1),
    ]


def test_default_instance_group_is_named_after_the_model(tmp_path):
    config = load_model_config(make_model(tmp_path, "plain", 'backend: "python"'))
    assert config.instance_groups == (InstanceGroupConfig("plain", "KIND_CPU", 1),)
    assert list(config.instance_names()) == [("plain_0", "KIND_CPU", 0)]


def test_default_instance_group_uses_gpus_when_there_are_some(tmp_path):
    config = load_model_config(make_model(tmp_path, "plain", 'backend: "python"'), gpus=[0])
    assert config.instance_groups == (InstanceGroupConfig("plain", "KIND_GPU", 1, (0,)),)


def test_onnxruntime_cpu_groups_default_to_two_instances(tmp_path):
    config = load_model_config(
        make_model(tmp_path, "onnx", 'platform: "onnxruntime_onnx"', model_file="model.onnx")
    )
    assert (config.backend, config.default_model_filename) == ("onnxruntime", "model.onnx")
    assert config.instance_groups[0].count == 2


def test_backend_only_gets_its_platform(tmp_path):
    config = load_model_config(
        make_model(tmp_path, "torch", 'backend: "pytorch"', model_file="model.pt")
    )
    assert (config.platform, config.default_model_filename) == ("pytorch_libtorch", "model.pt")


def test_version_policy_forms(tmp_path):
    specific = 'backend: "python"\nversion_policy: { specific: { versions: [3, 1] } }'
    all_ = 'backend: "python"\nversion_policy: { all: {} }'
    latest = 'backend: "python"\nversion_policy: { latest: { num_versions: 2 } }'
    assert load_model_config(make_model(tmp_path, "a", specific)).version_policy == (
        "specific",
        (1, 3),
    )
    assert load_model_config(make_model(tmp_path, "b", all_)).version_policy == ("all",)
    assert load_model_config(make_model(tmp_path, "c", latest)).version_policy == ("latest", 2)


def test_decoupled_and_response_cache(tmp_path):
    config = load_model_config(
        make_model(
            tmp_path,
            "stream",
            """
            backend: "python"
            model_transaction_policy { decoupled: true }
            response_cache { enable: true }
            """,
        )
    )
    assert config.decoupled is True
    assert config.response_cache is True


def test_name_is_taken_from_the_directory(tmp_path):
    config = load_model_config(make_model(tmp_path, "nameless", 'backend: "python"'))
    assert config.name == config.proto.name == "nameless"


def test_missing_config_is_minimal_python_model_when_not_strict(tmp_path):
    model_dir = make_model(tmp_path, "bare", None)
    config = load_model_config(model_dir)
    assert (config.name, config.backend, config.max_batch_size) == ("bare", "python", 0)
    assert config.inputs == config.outputs == ()
    assert config.config_file is None
    assert list(config.instance_names()) == [("bare_0", "KIND_CPU", 0)]


def test_missing_config_is_an_error_when_strict(tmp_path):
    model_dir = make_model(tmp_path, "bare", None)
    with pytest.raises(ConfigError) as info:
        load_model_config(model_dir, strict=True)
    assert info.value.path == str(model_dir / "config.pbtxt")
    assert "strict-model-config" in str(info.value)


def test_missing_config_without_model_file_says_what_to_add(tmp_path):
    with pytest.raises(ConfigError, match='add backend: "python"'):
        load_model_config(make_model(tmp_path, "empty", None, model_file=None))


def test_missing_directory(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_model_config(tmp_path / "nope")


def test_override_replaces_config_file(tmp_path):
    model_dir = make_model(tmp_path, "add_sub", ADD_SUB)
    config = load_model_config(
        model_dir, override={"backend": "python", "max_batch_size": 2, "input": []}
    )
    assert config.max_batch_size == 2
    assert config.inputs == ()
    assert config.config_file is None


def test_read_then_complete_allows_changes_in_between(tmp_path):
    source = read_config(make_model(tmp_path, "add_sub", ADD_SUB))
    changed = type(source.proto)()
    changed.CopyFrom(source.proto)
    changed.max_batch_size = 16
    config = complete_config(source, proto=changed)
    assert config.max_batch_size == 16
    assert source.proto.max_batch_size == 8  # the source is not changed
    assert not source.proto.HasField("version_policy")


def test_typed_config_is_frozen(tmp_path):
    config = load_model_config(make_model(tmp_path, "add_sub", ADD_SUB))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.parameters["mode"] = "slow"  # type: ignore[index]
