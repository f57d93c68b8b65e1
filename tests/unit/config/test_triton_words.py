"""Configuration errors Triton's L0_model_config matches by its words: shoal's message starts
with (or holds) Triton's text, then says where and what to change."""

from __future__ import annotations

import pytest

from shoal.config import ConfigError, load_model_config

from .helpers import make_model

pytestmark = pytest.mark.timeout(60)

IO = """
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

_HISTOGRAM = 'metric_identifier { family: "nv_inference_first_response_histogram_ms" }'

# (id, config.pbtxt, model file, Triton's words, field)
CASES = [
    (
        "metric control without identifier",
        'backend: "python"\nmodel_metrics { metric_control [ '
        "{ histogram_options { buckets: 1 } } ] }",
        "model.py",
        "metric control must specify 'metric_identifier'",
        "model_metrics.metric_control[0]",
    ),
    (
        "metric identifier without family",
        'backend: "python"\nmodel_metrics { metric_control [ { metric_identifier { } '
        "histogram_options { buckets: 1 } } ] }",
        "model.py",
        "metric identifier must specify non-empty 'family'",
        "model_metrics.metric_control[0]",
    ),
    (
        "metric control without histogram options",
        f'backend: "python"\nmodel_metrics {{ metric_control [ {{ {_HISTOGRAM} }} ] }}',
        "model.py",
        "metric control must specify 'histogram_options'",
        "model_metrics.metric_control[0]",
    ),
    (
        "histogram options without buckets",
        f'backend: "python"\nmodel_metrics {{ metric_control [ {{ {_HISTOGRAM} '
        "histogram_options { } } ] }",
        "model.py",
        "histogram options must specify non-empty 'buckets'",
        "model_metrics.metric_control[0]",
    ),
    (
        "unknown platform, backend from the default model file",
        'platform: "onnxruntim"\ndefault_model_filename: "model.onnx"',
        "model.onnx",
        "unexpected 'platform' and 'backend' pair, got:onnxruntim, onnxruntime",
        "platform",
    ),
    (
        "known backend, platform of another",
        'platform: "pytorch_libtorch"\nbackend: "onnxruntime"',
        "model.onnx",
        "unexpected 'platform' and 'backend' pair, got:pytorch_libtorch, onnxruntime",
        "platform",
    ),
    (
        "ensemble with a backend",
        'platform: "ensemble"\nbackend: "onnxruntime"',
        None,
        "Ensemble model 'm' must have platform type 'ensemble' and empty backend type",
        "backend",
    ),
    (
        "no backend, no model file, no dot in the name",
        "max_batch_size: 1",
        None,
        "Invalid model name: Could not determine backend for model 'm' with no backend in "
        "model configuration. Expected model name of the form 'model.<backend_name>'.",
        "backend",
    ),
    (
        "unknown platform, no backend",
        'platform: "onnxruntim"',
        "model.onnx",
        "unexpected platform type 'onnxruntim' for m",
        "platform",
    ),
]


_SEQUENCE = """
sequence_batching {{ control_input [
  {{ name: "A" control [ {{ kind: CONTROL_SEQUENCE_START {a} }} ] }},
  {{ name: "{b_name}" control [ {{ kind: {b_kind} int32_false_true: [ 0, 1 ] }} ] }} ] }}
"""

# (id, what follows 'backend: "python"', Triton's words): each config is Triton's own QA's
# (L0_model_config/noautofill_platform) in small
PYTHON_CASES = [
    (
        "negative max_batch_size",
        "max_batch_size: -1",
        "'max_batch_size' must be non-negative value for m",
    ),
    (
        "zero dimension",
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1, 0 ] } ]',
        "model input 'X' dimension must be integer >= 1, or -1 to indicate a variable-size "
        "dimension for m",
    ),
    (
        "zero reshape dimension",
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] reshape { shape: [ 0 ] } } ]',
        "model output 'Y' reshape dimensions must be integer >= 1, or -1 to indicate a "
        "variable-size dimension for m",
    ),
    (
        "no data type",
        'input [ { name: "X" dims: [ 1 ] } ]',
        "model input 'X' must specify 'data_type' for m",
    ),
    (
        "empty reshape without batching",
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] reshape { } } ]',
        "model input 'X' cannot have empty reshape for non-batching model as scalar tensors "
        "are not supported for m",
    ),
    (
        "reshape of another size",
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 2, -1 ] reshape { shape: [ 2, 2 ] } } ]',
        "model input 'X' has different size for dims and reshape for m",
    ),
    (
        "reshape with more variable dimensions",
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 2, -1 ] '
        "reshape { shape: [ 2, -1, -1 ] } } ]",
        "model input 'X' has different number of variable-size dimensions for dims and "
        "reshape for m",
    ),
    (
        "default priority level out of range",
        "max_batch_size: 4\ndynamic_batching { priority_levels: 3 default_priority_level: 0 }",
        "default priority level must be in range [1, 3] for m",
    ),
    (
        "queue policy level out of range",
        "max_batch_size: 4\ndynamic_batching { priority_levels: 3 default_priority_level: 1 "
        "priority_queue_policy { key: 4 value { } } }",
        "priority queue policy must have priority level in range [1, 3] for m",
    ),
    (
        "preserve ordering with priorities",
        "max_batch_size: 4\ndynamic_batching { preserve_ordering: true priority_levels: 2 "
        "default_priority_level: 1 }",
        "Only one priority level is allowed when 'preserve_ordering' is true for m",
    ),
    (
        "preserve ordering with a delay policy",
        "max_batch_size: 4\ndynamic_batching { preserve_ordering: true default_queue_policy "
        "{ timeout_action: DELAY default_timeout_microseconds: 10 } }",
        "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m",
    ),
    (
        "cpu group with gpus",
        'instance_group [ { name: "g" kind: KIND_CPU gpus: [ 0 ] } ]',
        "instance group g of model m has kind KIND_CPU but specifies one or more GPUs",
    ),
    (
        "two start controls",
        "max_batch_size: 4\n"
        + _SEQUENCE.format(
            a="int32_false_true: [ 0, 1 ]", b_name="B", b_kind="CONTROL_SEQUENCE_START"
        ),
        "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m",
    ),
    (
        "one tensor for two controls",
        "max_batch_size: 4\n"
        + _SEQUENCE.format(
            a="int32_false_true: [ 0, 1 ]", b_name="A", b_kind="CONTROL_SEQUENCE_READY"
        ),
        "sequence batching control tensor 'A' is specified for multiple control kinds for m",
    ),
    (
        "control without values",
        "max_batch_size: 4\n" + _SEQUENCE.format(a="", b_name="B", b_kind="CONTROL_SEQUENCE_READY"),
        "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
        "'bool_false_true' for CONTROL_SEQUENCE_START for m",
    ),
    (
        "batch input without source",
        'max_batch_size: 4\nbatch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "C" '
        "data_type: TYPE_FP32 } ]",
        "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0 for m",
    ),
    (
        "batch input of an unknown input",
        'max_batch_size: 4\nbatch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "C" '
        'data_type: TYPE_FP32 source_input: "NOPE" } ]',
        "unknown source input name 'NOPE' for m",
    ),
    (
        "batch input of another type",
        'max_batch_size: 4\nbatch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "C" '
        'data_type: TYPE_INT64 source_input: "IN" } ]',
        "batch input data type must be TYPE_INT32 or TYPE_FP32 for m",
    ),
    (
        "batch output of an unknown output",
        "max_batch_size: 4\nbatch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE "
        'source_input: "IN" target_name: "NOPE" } ]',
        "unknown target output name 'NOPE' for m",
    ),
    (
        "batch output naming its target twice",
        "max_batch_size: 4\nbatch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE "
        'source_input: "IN" target_name: [ "OUT", "OUT" ] } ]',
        "target output name 'OUT' can only be specified once for m",
    ),
]


@pytest.mark.parametrize(
    ("config", "words"), [c[1:] for c in PYTHON_CASES], ids=[c[0] for c in PYTHON_CASES]
)
def test_tritons_words_for_a_python_model(tmp_path, config, words):
    model_dir = make_model(tmp_path, "m", 'backend: "python"\n' + config + IO)
    with pytest.raises(ConfigError) as info:
        load_model_config(model_dir)
    assert words in info.value.message


@pytest.mark.parametrize(
    ("config", "model_file", "words", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_tritons_words(tmp_path, config, model_file, words, field):
    model_dir = make_model(tmp_path, "m", config + IO, model_file=model_file)
    with pytest.raises(ConfigError) as info:
        load_model_config(model_dir)
    assert words in info.value.message
    assert info.value.field == field


def test_python_backend_takes_any_platform(tmp_path):
    # Triton pairs only the backends it knows (GetBackendType) with platforms
    model_dir = make_model(tmp_path, "m", 'backend: "python"\nplatform: "anything"' + IO)
    assert load_model_config(model_dir).backend == "python"


def test_metric_control_with_identifier_and_buckets_loads(tmp_path):
    text = (
        f'backend: "python"\nmodel_metrics {{ metric_control [ {{ {_HISTOGRAM} '
        "histogram_options { buckets: [ 1, 10 ] } } ] }"
    )
    model_dir = make_model(tmp_path, "m", text + IO)
    assert load_model_config(model_dir).name == "m"


_STEP = 'step [ { model_name: "a" model_version: -1 input_map { key: "x" value: "IN" } '
_ENSEMBLE_CASES = [
    (
        "ensemble with instance groups",
        f"instance_group [ {{ count: 1 }} ]\nensemble_scheduling {{ {_STEP}"
        'output_map { key: "y" value: "OUT" } } ] }',
        "instance group should not be specified for ensemble 'm'",
    ),
    (
        "ensemble without steps",
        "ensemble_scheduling { }",
        "must specify 'step' for ensemble 'm'",
    ),
    (
        "ensemble step without output_map",
        f"ensemble_scheduling {{ {_STEP} }} ] }}",
        "must specify 'output_map' in step 0 of ensemble 'm'",
    ),
    (
        "ensemble tensor nobody reads",
        f'ensemble_scheduling {{ {_STEP} output_map {{ key: "y" value: "OUT" }} '
        'output_map { key: "z" value: "spare" } } ] }',
        "ensemble tensor 'spare' is unused in ensemble 'm'",
    ),
]


@pytest.mark.parametrize(
    ("config", "words"), [c[1:] for c in _ENSEMBLE_CASES], ids=[c[0] for c in _ENSEMBLE_CASES]
)
def test_tritons_words_for_an_ensemble(tmp_path, config, words):
    text = 'platform: "ensemble"\nmax_batch_size: 4\n' + config + IO
    model_dir = make_model(tmp_path, "m", text, model_file=None)
    with pytest.raises(ConfigError) as info:
        load_model_config(model_dir)
    assert words in info.value.message


def test_a_dotted_model_name_names_its_backend(tmp_path):
    # Triton's custom-backend convention: model "<anything>.<backend>"
    model_dir = make_model(tmp_path, "any.identity", IO, model_file=None)
    config = load_model_config(model_dir)
    assert (config.backend, config.default_model_filename) == ("identity", "model.identity")


def test_a_dotted_name_says_nothing_where_the_config_names_a_model_file(tmp_path):
    # Triton reads the backend from the name only when the config gives no backend, platform
    # or default_model_filename (model_config_utils.cc's custom-backend case)
    text = 'default_model_filename: "weights.bin"\n' + IO
    model_dir = make_model(tmp_path, "any.identity", text, model_file=None)
    with pytest.raises(ConfigError) as info:
        load_model_config(model_dir)
    assert "backend" in info.value.message
