"""Every validation error: its message says what to change, and where."""

from __future__ import annotations

import textwrap

import pytest

from shoal.config import ConfigError, load_model_config

from .helpers import make_model

IO = """
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

# (id, config.pbtxt after 'backend: "python"' on line 1, line of the error, field, message parts)
CASES = [
    (
        "negative max_batch_size",
        "max_batch_size: -1",
        2,
        "max_batch_size",
        ["max_batch_size -1", "use 0 for a model that does not batch"],
    ),
    (
        "input without name",
        "input [ { data_type: TYPE_FP32 dims: [ 1 ] } ]",
        2,
        "input[0]",
        ["input 0 of model 'm' has no name", 'add name: "..."'],
    ),
    (
        "output without name",
        'output [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] },\n{ dims: [ 1 ] } ]',
        3,
        "output[1]",
        ["output 1 of model 'm' has no name"],
    ),
    (
        "duplicate input",
        'input { name: "A" data_type: TYPE_FP32 dims: 1 }\n'
        'input { name: "A" data_type: TYPE_INT32 dims: 1 }',
        3,
        "input[1]",
        ["input 'A' of model 'm' is declared twice (inputs 0 and 1)", "its own name"],
    ),
    (
        "duplicate output",
        'output [ { name: "O" data_type: TYPE_FP32 dims: 1 }, { name: "O" data_type: TYPE_FP32'
        " dims: 1 } ]",
        2,
        "output[1]",
        ["output 'O' of model 'm' is declared twice"],
    ),
    (
        "missing data type",
        'input [ { name: "A"\n dims: [ 1 ] } ]',
        2,
        "input[0].data_type",
        ["input 'A' of model 'm' has no data_type", "add data_type: TYPE_FP32"],
    ),
    (
        "TYPE_INVALID written out",
        'output [ { name: "B" dims: [ 1 ]\n data_type: TYPE_INVALID } ]',
        3,
        "output[0].data_type",
        ["output 'B' of model 'm' has no data_type"],
    ),
    (
        "empty dims",
        'input [ { name: "A" data_type: TYPE_FP32 } ]',
        2,
        "input[0].dims",
        ["input 'A' of model 'm' has no dims", "add dims: [ ... ]"],
    ),
    (
        "zero dim",
        'input [ { name: "A" data_type: TYPE_FP32\n  dims: [ 4, 0 ] } ]',
        3,
        "input[0].dims",
        ["has dims [4, 0]", "integer >= 1, or -1", "change 0"],
    ),
    (
        "dim below -1",
        'output [ { name: "A" data_type: TYPE_FP32 dims: [ -2 ] } ]',
        2,
        "output[0].dims",
        ["output 'A' of model 'm' has dims [-2]", "change -2"],
    ),
    (
        "reshape element count",
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 2, 3 ]\n reshape: { shape: [ 4 ] } } ]',
        3,
        "input[0].reshape",
        ["dims [2, 3] and reshape [4]", "different numbers of elements"],
    ),
    (
        "reshape variable dims",
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 2, -1 ]\n'
        "reshape { shape: [ -1, 2 ] } } ]",
        3,
        "input[0].reshape",
        ["dims [2, -1] and reshape [-1, 2]"],
    ),
    (
        "empty reshape without batching",
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] reshape: { } } ]',
        2,
        "input[0].reshape",
        ["empty reshape", "set max_batch_size"],
    ),
    (
        "bad reshape dim",
        'max_batch_size: 1\ninput [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ]\n'
        "reshape: { shape: [ 0 ] } } ]",
        4,
        "input[0].reshape.shape",
        ["has reshape [0]"],
    ),
    (
        "image format needs three dims",
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] format: FORMAT_NCHW } ]',
        2,
        "input[0].format",
        ["format FORMAT_NCHW, which needs exactly 3 dims", "FORMAT_NONE"],
    ),
    (
        "preferred batch size above max",
        "max_batch_size: 4\ndynamic_batching {\n  preferred_batch_size: [ 2, 8 ]\n}",
        4,
        "dynamic_batching.preferred_batch_size",
        ["preferred_batch_size 8", "at most max_batch_size 4"],
    ),
    (
        "preferred batch size without batching",
        "dynamic_batching { preferred_batch_size: 2 }",
        2,
        "dynamic_batching.preferred_batch_size",
        ["preferred_batch_size 2", "max_batch_size, which is 0"],
    ),
    (
        "preferred batch size zero",
        "max_batch_size: 4\ndynamic_batching { preferred_batch_size: 0 }",
        3,
        "dynamic_batching.preferred_batch_size",
        ["preferred_batch_size 0", "at least 1"],
    ),
    (
        "default priority level out of range",
        "max_batch_size: 4\ndynamic_batching { priority_levels: 2\n default_priority_level: 3 }",
        4,
        "dynamic_batching.default_priority_level",
        ["default_priority_level 3", "between 1 and 2"],
    ),
    (
        "priority queue policy level out of range",
        "max_batch_size: 4\ndynamic_batching { priority_levels: 2 default_priority_level: 1\n"
        "priority_queue_policy { key: 5 value { } } }",
        4,
        "dynamic_batching.priority_queue_policy",
        ["priority_queue_policy for level 5", "the levels are 1 to 2"],
    ),
    (
        "preserve ordering with priorities",
        "max_batch_size: 4\ndynamic_batching { priority_levels: 2 default_priority_level: 1\n"
        "preserve_ordering: true }",
        4,
        "dynamic_batching.preserve_ordering",
        ["preserve_ordering with priority_levels 2"],
    ),
    (
        "preserve ordering with delay policy",
        "max_batch_size: 4\ndynamic_batching { preserve_ordering: true\n"
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 10 } }",
        3,
        "dynamic_batching.preserve_ordering",
        ["timeout_action is DELAY", "use REJECT"],
    ),
    (
        "negative instance count",
        "instance_group [\n  { count: -2 } ]",
        3,
        "instance_group[0].count",
        ["instance group 0 of model 'm' has count -2", "1 or more"],
    ),
    (
        "gpu kind without gpus",
        "instance_group [ { kind: KIND_GPU } ]",
        2,
        "instance_group[0].kind",
        ["instance group 'm_0' of model 'm' has kind KIND_GPU but no GPUs are available"],
    ),
    (
        "cpu kind with gpus",
        'instance_group [ { name: "g" kind: KIND_CPU\n gpus: [ 0 ] } ]',
        3,
        "instance_group[0].gpus",
        ["instance group 'g' of model 'm' has kind KIND_CPU but lists gpus [0]"],
    ),
    (
        "auto kind with unknown gpu",
        "instance_group [ { kind: KIND_AUTO gpus: [ 7 ] } ]",
        2,
        "instance_group[0].gpus",
        ["has kind KIND_CPU but lists gpus [7]"],
    ),
    (
        "latest zero versions",
        "version_policy { latest { num_versions: 0 } }",
        2,
        "version_policy.latest.num_versions",
        ["num_versions 0", "num_versions: 1"],
    ),
    (
        "specific without versions",
        "version_policy { specific { } }",
        2,
        "version_policy.specific.versions",
        ["version_policy specific with versions []"],
    ),
    (
        "name differs from directory",
        'name: "other"',
        2,
        "name",
        ["names the model 'other' but its directory is 'm'", 'change name to "m"'],
    ),
]


@pytest.mark.parametrize(
    ("config", "line", "field", "parts"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_validation_error(tmp_path, config, line, field, parts):
    model_dir = make_model(tmp_path, "m", 'backend: "python"\n' + config)
    with pytest.raises(ConfigError) as info:
        load_model_config(model_dir)
    error = info.value
    assert error.path == str(model_dir / "config.pbtxt")
    assert (error.line, error.field) == (line, field)
    for part in parts:
        assert part in error.message
    assert str(error).startswith(f"{model_dir / 'config.pbtxt'}:{line}: ")


def test_gpu_not_available(tmp_path):
    model_dir = make_model(
        tmp_path, "m", 'backend: "python"\ninstance_group { kind: KIND_GPU\ngpus: [ 0, 2 ] }'
    )
    with pytest.raises(ConfigError) as info:
        load_model_config(model_dir, gpus=[0, 1])
    assert info.value.line == 3
    assert "lists GPU 2, which is not available (available GPUs: 0, 1)" in info.value.message


def test_no_backend_or_platform(tmp_path):
    model_dir = make_model(tmp_path, "m", "max_batch_size: 1", model_file="weights.bin")
    with pytest.raises(ConfigError, match='add backend: "python"') as info:
        load_model_config(model_dir)
    assert info.value.field == "backend"


def test_dynamic_batching_without_max_batch_size_is_accepted_with_a_warning(tmp_path):
    # Triton runs such a model through the dynamic batcher one request at a time.
    config = load_model_config(make_model(tmp_path, "m", 'backend: "python"\ndynamic_batching { }'))
    assert config.dynamic_batching is not None
    assert config.dynamic_batching.preferred_batch_sizes == ()
    (warning,) = config.warnings
    assert "max_batch_size 0" in warning and "set max_batch_size" in warning


SEQUENCE_CASES = [
    (
        "control without name",
        "control_input [ { control [ { kind: CONTROL_SEQUENCE_START\n"
        "int32_false_true: [0, 1] } ] } ]",
        "control_input 0 of model 'm' has no name",
    ),
    (
        "control tensor twice",
        'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
        'int32_false_true: [0, 1] } ] }, { name: "S" control [ { kind: CONTROL_SEQUENCE_END '
        "int32_false_true: [0, 1] } ] } ]",
        "control tensor 'S' of model 'm' is listed in more than one control_input",
    ),
    (
        "control input without control",
        'control_input [ { name: "S" } ]',
        "control_input 'S' of model 'm' has no control",
    ),
    (
        "two start controls",
        'control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_START '
        'int32_false_true: [0, 1] } ] }, { name: "B" control [ { kind: CONTROL_SEQUENCE_START '
        "int32_false_true: [0, 1] } ] } ]",
        "two CONTROL_SEQUENCE_START control tensors ('A' and 'B')",
    ),
    (
        "boolean control without values",
        'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_READY } ] } ]',
        "must give exactly one of int32_false_true, fp32_false_true or bool_false_true",
    ),
    (
        "boolean control with one value",
        'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_END '
        "int32_false_true: [ 1 ] } ] } ]",
        "with two values: the false value then the true value",
    ),
    (
        "boolean control with two kinds of values",
        'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_END '
        "int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ] } ] } ]",
        "exactly one of int32_false_true",
    ),
    (
        "corrid with values",
        'control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
        "int32_false_true: [ 0, 1 ] data_type: TYPE_UINT64 } ] } ]",
        "sets int32_false_true, which a correlation-id control does not use",
    ),
    (
        "corrid float",
        'control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
        "data_type: TYPE_FP32 } ] } ]",
        "has data_type TYPE_FP32: a correlation-id control must be TYPE_UINT64",
    ),
    (
        "state without output name",
        'state [ { input_name: "I" data_type: TYPE_FP32 dims: [ 1 ] } ]',
        "state 0 of model 'm' needs both input_name and output_name",
    ),
    (
        "state without data type",
        'state [ { input_name: "I" output_name: "O" dims: [ 1 ] } ]',
        "state 'I' of model 'm' has no data_type",
    ),
    (
        "state without dims",
        'state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 } ]',
        "state 'I' of model 'm' has no dims",
    ),
    (
        "state with zero dim",
        'state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ 0 ] } ]',
        "has dims [0]",
    ),
    (
        "initial state without data",
        'state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ 1 ] '
        'initial_state { name: "init" data_type: TYPE_FP32 dims: [ 1 ] } } ]',
        "initial_state 'init' of sequence_batching state 'I' of model 'm' gives no data",
    ),
    (
        "initial state of other type",
        'state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ 1 ] '
        "initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } ]",
        "has data_type TYPE_INT32 but the state is TYPE_FP32",
    ),
    (
        "oldest preferred batch size",
        "oldest { preferred_batch_size: [ 16 ] }",
        "sequence_batching oldest preferred_batch_size 16",
    ),
]


@pytest.mark.parametrize(
    ("body", "part"), [c[1:] for c in SEQUENCE_CASES], ids=[c[0] for c in SEQUENCE_CASES]
)
def test_sequence_batching_error(tmp_path, body, part):
    text = f'backend: "python"\nmax_batch_size: 4\nsequence_batching {{\n{body}\n}}'
    with pytest.raises(ConfigError) as info:
        load_model_config(make_model(tmp_path, "m", text))
    assert part in info.value.message
    assert info.value.line == 4
    assert info.value.field.startswith("sequence_batching.")


def _ensemble(steps: str, io: str = IO, extra: str = "") -> str:
    return textwrap.dedent(
        f"""
        platform: "ensemble"
        {io}
        {extra}
        ensemble_scheduling {{
          step [
        {steps}
          ]
        }}
        """
    )


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}"{maps} }}'


ENSEMBLE_CASES = [
    (
        "no steps",
        'platform: "ensemble"\nensemble_scheduling { }',
        "ensemble_scheduling",
        "without steps",
    ),
    (
        "ensemble platform without scheduling",
        'platform: "ensemble"',
        "platform",
        "but no ensemble_scheduling",
    ),
    (
        "scheduling on another platform",
        'backend: "python"\n'
        + "ensemble_scheduling { step [ "
        + _step("a", {"x": "IN"}, {"y": "OUT"})
        + " ] }",
        "ensemble_scheduling",
        "has ensemble_scheduling but platform ''",
    ),
    (
        "instance group",
        _ensemble(_step("a", {"x": "IN"}, {"y": "OUT"}), extra="instance_group [ { count: 1 } ]"),
        "instance_group",
        "cannot have instance_group",
    ),
    (
        "warmup",
        _ensemble(_step("a", {"x": "IN"}, {"y": "OUT"}), extra='model_warmup [ { name: "w" } ]'),
        "model_warmup",
        "cannot have model_warmup",
    ),
    (
        "optimization",
        _ensemble(_step("a", {"x": "IN"}, {"y": "OUT"}), extra="optimization { }"),
        "optimization",
        "cannot have optimization",
    ),
    (
        "step without model",
        _ensemble('{ input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } }'),
        "ensemble_scheduling.step[0]",
        "step 0 of ensemble model 'm' has no model_name",
    ),
    (
        "step without outputs",
        _ensemble('{ model_name: "a" input_map { key: "x" value: "IN" } }'),
        "ensemble_scheduling.step[0]",
        "has no output_map",
    ),
    (
        "tensor written twice",
        _ensemble(
            _step("a", {"x": "IN"}, {"y": "OUT"}) + ",\n" + _step("b", {"x": "IN"}, {"z": "OUT"})
        ),
        "ensemble_scheduling.step[1].output_map",
        "ensemble tensor 'OUT' of model 'm' is written by steps 0 and 1",
    ),
    (
        "unused input",
        _ensemble(
            _step("a", {"x": "OTHER"}, {"y": "OUT"}),
        ),
        "input[0]",
        "ensemble input 'IN' of model 'm' is not used by any step",
    ),
    (
        "output not written",
        _ensemble(_step("a", {"x": "IN"}, {"y": "out_typo"})),
        "output[0]",
        "ensemble output 'OUT' of model 'm' is not written by any step",
    ),
    (
        "tensor nobody produces",
        _ensemble(
            _step("a", {"x": "IN", "w": "missing"}, {"y": "OUT"}),
        ),
        "output[0]",
        # Triton's words and order: the output first, then the tensor upstream
        "output 'OUT' for ensemble 'm' is not written: at least one of its depending tensors, "
        "'missing', is not connected",
    ),
    (
        "tensor nobody reads",
        _ensemble(_step("a", {"x": "IN"}, {"y": "OUT", "z": "spare"})),
        "ensemble_scheduling.step[0].output_map",
        "ensemble tensor 'spare' of model 'm' is written by step 0 but no step reads it",
    ),
]


@pytest.mark.parametrize(
    ("text", "field", "part"), [c[1:] for c in ENSEMBLE_CASES], ids=[c[0] for c in ENSEMBLE_CASES]
)
def test_ensemble_error(tmp_path, text, field, part):
    model_dir = make_model(tmp_path, "m", text, model_file=None)
    with pytest.raises(ConfigError) as info:
        load_model_config(model_dir)
    assert part in info.value.message
    assert info.value.field == field
    assert info.value.line is not None


def test_ensemble_chain_through_intermediate_tensors_is_valid(tmp_path):
    steps = ",\n".join(
        [
            _step("a", {"x": "IN"}, {"y": "t1"}),
            _step("b", {"x": "t1"}, {"y": "t2", "z": "t3"}),
            _step("c", {"p": "t2", "q": "t3"}, {"y": "OUT"}),
        ]
    )
    config = load_model_config(make_model(tmp_path, "m", _ensemble(steps), model_file=None))
    assert [step.model_name for step in config.ensemble_steps] == ["a", "b", "c"]


def test_ensemble_max_inflight_requests_is_accepted_with_a_warning(tmp_path):
    text = _ensemble(_step("a", {"x": "IN"}, {"y": "OUT"})).replace(
        "ensemble_scheduling {", "ensemble_scheduling {\n  max_inflight_requests: 4"
    )
    config = load_model_config(make_model(tmp_path, "m", text, model_file=None))
    (warning,) = config.warnings
    assert "max_inflight_requests 4" in warning and "no effect" in warning


def test_errors_without_a_file_have_no_line(tmp_path):
    model_dir = make_model(tmp_path, "m", None)
    with pytest.raises(ConfigError) as info:
        load_model_config(model_dir, override={"backend": "python", "max_batch_size": -3})
    assert (info.value.path, info.value.line) == (str(model_dir), None)
    assert str(info.value).startswith(
        f"{model_dir}: 'max_batch_size' must be non-negative value for m: "
        "model 'm' has max_batch_size -3"
    )
