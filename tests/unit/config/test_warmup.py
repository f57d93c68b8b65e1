"""model_warmup samples Triton cannot build are refused when the configuration loads."""

from __future__ import annotations

import pytest

from shoal.config import ConfigError, load_model_config

from .helpers import make_model

IO = """
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
ZERO = 'inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }'

CASES = [
    (
        "batch size 0",
        f'max_batch_size: 4\nmodel_warmup [ {{ name: "w" {ZERO} }} ]',
        "model_warmup[0].batch_size",
        "warmup sample 'w' of model 'm' has batch_size 0: it must be 1 or more",
    ),
    (
        "batching a model that does not batch",
        f'model_warmup [ {{ name: "w" batch_size: 2 {ZERO} }} ]',
        "model_warmup[0].batch_size",
        "the model does not batch (max_batch_size 0): use batch_size: 1",
    ),
    (
        "above max_batch_size",
        f'max_batch_size: 4\nmodel_warmup [ {{ name: "w" batch_size: 8 {ZERO} }} ]',
        "model_warmup[0].batch_size",
        "batch_size 8, more than the model's max_batch_size 4",
    ),
    (
        "no data",
        'model_warmup [ { name: "w" batch_size: 1 inputs { key: "IN" value: {'
        " data_type: TYPE_FP32 dims: [ 4 ] } } } ]",
        "model_warmup[0].inputs.IN",
        "input 'IN' of warmup sample 'w' of model 'm' says nothing about its data",
    ),
    (
        "variable dims",
        'model_warmup [ { name: "w" batch_size: 1 inputs { key: "IN" value: {'
        " data_type: TYPE_FP32 dims: [ -1 ] zero_data: true } } } ]",
        "model_warmup[0].inputs.IN.dims",
        "needs a fixed shape (no -1)",
    ),
    (
        "no data type",
        'model_warmup [ { name: "w" batch_size: 1 inputs { key: "IN" value: {'
        " dims: [ 4 ] zero_data: true } } } ]",
        "model_warmup[0].inputs.IN.data_type",
        "has no data_type",
    ),
]


@pytest.mark.parametrize(
    ("body", "field", "part"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_warmup_error(tmp_path, body, field, part):
    model_dir = make_model(tmp_path, "m", 'backend: "python"\n' + IO + body)
    with pytest.raises(ConfigError) as info:
        load_model_config(model_dir)
    assert info.value.field == field
    assert part in info.value.message


def test_valid_samples_load(tmp_path):
    body = f'max_batch_size: 4\nmodel_warmup [ {{ name: "w" batch_size: 4 count: 2 {ZERO} }} ]'
    config = load_model_config(make_model(tmp_path, "m", 'backend: "python"\n' + IO + body))
    assert config.proto.model_warmup[0].count == 2
