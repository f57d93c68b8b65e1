"""Syntax errors in config.pbtxt: located, and with the name that was probably meant."""

from __future__ import annotations

import pytest

from shoal.config import ConfigError, load_model_config, parse_config_text

from .helpers import make_model

CASES = [
    (
        'name: "x"\n  inputs { name: "a" }',
        2,
        3,
        ['no field named "inputs"', 'did you mean "input"?'],
    ),
    (
        'input { name: "a"\n  data_type: TYPE_FLOAT32 }',
        2,
        14,
        ["no value named TYPE_FLOAT32", "did you mean TYPE_FP32?"],
    ),
    ("input { data_type: BYTES }", 1, 20, ["did you mean TYPE_STRING?", '"BYTES" tensors']),
    ("input { data_type: TYPE_FP31 }", 1, 20, ["did you mean TYPE_FP32?"]),
    ("instance_group [{kind: KIND_XPU}]", 1, 24, ['"ModelInstanceGroup.Kind"', "KIND_GPU?"]),
    (
        "dynamic_batching { max_queue_delay: 100 }",
        1,
        20,
        ['"ModelDynamicBatching" has no field', 'did you mean "max_queue_delay_microseconds"?'],
    ),
    ("zzz: 1", 1, 1, ['no field named "zzz"', "the fields are: name, platform, backend"]),
    ("max_batch_size: 1.5", 1, 17, ["Couldn't parse integer"]),
    ('name: "a"\nname: "b"', 2, 7, ['should not have multiple "name" fields']),
    ("input { dims: [1, 2 }", 1, 21, ['Expected ","']),
    ("dynamic_batching {}\nsequence_batching {}", 2, 1, ["another member of oneof"]),
    ('name: "unterminated', 1, 7, ["missing ending quote"]),
]


@pytest.mark.parametrize(("text", "line", "column", "parts"), CASES)
def test_parse_error(text, line, column, parts):
    with pytest.raises(ConfigError) as info:
        parse_config_text(text, path="m/config.pbtxt")
    error = info.value
    assert (error.path, error.line, error.column) == ("m/config.pbtxt", line, column)
    for part in parts:
        assert part in error.message
    assert "shoal.inference" not in error.message
    assert str(error).startswith(f"m/config.pbtxt:{line}:{column}: ")


def test_parse_error_from_a_model_directory(tmp_path):
    model_dir = make_model(tmp_path, "m", 'backend: "python"\nmax_batch_size: "eight"')
    with pytest.raises(ConfigError) as info:
        load_model_config(model_dir)
    assert info.value.path == str(model_dir / "config.pbtxt")
    assert info.value.line == 2


def test_comments_and_both_list_syntaxes_parse():
    config = parse_config_text(
        """
        # leading comment
        input [ { name: "A" data_type: TYPE_FP32 dims: [ 1, 2 ] } ]  # trailing
        input { name: "B" data_type: TYPE_INT64 dims: 3 dims: 4 }
        parameters: { key: "k" value: { string_value: "v" } }
        """
    )
    assert [i.name for i in config.input] == ["A", "B"]
    assert list(config.input[1].dims) == [3, 4]
    assert config.parameters["k"].string_value == "v"


def test_not_utf8(tmp_path):
    model_dir = make_model(tmp_path, "m", "")
    (model_dir / "config.pbtxt").write_bytes(b'name: "\xff"')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_model_config(model_dir)
