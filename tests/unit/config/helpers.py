"""Model directories for config tests."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from pathlib import Path


def make_model(
    root: Path,
    name: str,
    config: str | None,
    *,
    versions: Iterable[int] = (1,),
    model_file: str | None = "model.py",
) -> Path:
    """Create ``root/name`` with ``config.pbtxt`` (unless ``config`` is None) and version dirs."""
    model_dir = root / name
    model_dir.mkdir(parents=True)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(textwrap.dedent(config).lstrip("\n"))
    for version in versions:
        (model_dir / str(version)).mkdir()
        if model_file:
            (model_dir / str(version) / model_file).write_text("")
    return model_dir


ADD_SUB = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 5000000 }
  priority_queue_policy {
    key: 1
    value { timeout_action: DELAY default_timeout_microseconds: 100 max_queue_size: 16 }
  }
}
instance_group [ { count: 2, kind: KIND_CPU } ]
parameters: {
  key: "EXECUTION_ENV_PATH",
  value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" }
}
parameters { key: "mode" value { string_value: "fast" } }
"""

SEQUENCE = """
name: "accumulate"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest {
    max_candidate_sequences: 4
    preferred_batch_size: [ 2, 4 ]
    max_queue_delay_microseconds: 100
  }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [
    {
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ -1 ]
      initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zeros" }
    }
  ]
}
"""

ENSEMBLE = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 10 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "preprocess"
      model_version: -1
      input_map { key: "TEXT" value: "RAW" }
      output_map { key: "TOKENS" value: "tokens" }
    },
    {
      model_name: "classifier"
      model_version: 2
      input_map { key: "INPUT_IDS" value: "tokens" }
      output_map { key: "LOGITS" value: "SCORES" }
    }
  ]
}
"""
