"""DataType names and KServe V2 datatype names."""

from __future__ import annotations

import pytest

from shoal.config import V2_DATATYPES, ConfigError, config_dtype_to_v2, v2_to_config_dtype
from shoal.ipc.dtypes import DATATYPES
from shoal.protos import model_config_pb2 as pb


@pytest.mark.parametrize(
    ("config", "v2"),
    [
        ("TYPE_FP32", "FP32"),
        ("TYPE_STRING", "BYTES"),
        ("TYPE_BF16", "BF16"),
        ("TYPE_BOOL", "BOOL"),
        ("TYPE_UINT64", "UINT64"),
        ("TYPE_FP16", "FP16"),
    ],
)
def test_conversions(config, v2):
    assert config_dtype_to_v2(config) == v2
    assert config_dtype_to_v2(pb.DataType.Value(config)) == v2
    assert v2_to_config_dtype(v2) == config


def test_every_data_type_round_trips():
    names = [name for name in pb.DataType.keys() if name != "TYPE_INVALID"]  # noqa: SIM118
    assert [v2_to_config_dtype(config_dtype_to_v2(name)) for name in names] == names
    assert set(V2_DATATYPES) == set(DATATYPES)


@pytest.mark.parametrize("bad", ["TYPE_INVALID", 0, "FP32", 99])
def test_invalid_config_types(bad):
    with pytest.raises(ConfigError):
        config_dtype_to_v2(bad)


@pytest.mark.parametrize("bad", ["TYPE_FP32", "fp32", "STRING"])
def test_invalid_v2_types(bad):
    with pytest.raises(ConfigError, match="is not a tensor datatype"):
        v2_to_config_dtype(bad)
