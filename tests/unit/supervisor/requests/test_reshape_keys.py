"""A reshape's -1 dimensions resolved from the request, the same on both sides (the core's
staging and a worker's packing), and the dynamic batcher's one-input key: the same bytes as the
general key, from either side."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.config import load_model_config
from shoal.core import packed as core_packed
from shoal.core.packed import model_shape, one_key, reshape_sources, shape_key
from shoal.core.types import InferInput
from shoal.frontends.workers.packing import Snapshot, prepare
from shoal.ipc.arena import OwnedArena
from shoal.ipc.records import RequestRecord
from shoal.supervisor.requests import packed
from shoal.supervisor.schedulers._batching import dynamic_settings
from shoal.supervisor.schedulers._batching import shape_key as core_key
from tests.unit.frontends.workers.test_packing import SLOT, _call, _core_verdict, _req, _summary

pytestmark = pytest.mark.timeout(30)

#: Triton's documented case: a variable dim reshaped with a -1 (``dims: [-1]`` to ``[-1, 1]``),
#: and an input with two -1s between fixed runs.
RESHAPED = """
name: "m"
backend: "python"
max_batch_size: 8
input [
  { name: "V" data_type: TYPE_FP32 dims: [ -1 ] reshape: { shape: [ -1, 1 ] } }
]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
"""


def _v(rows: int, width: int) -> InferInput:
    values = np.arange(rows * width, dtype=np.float32).reshape(rows, width)
    return InferInput("V", "FP32", (rows, width), values.tobytes())


def test_a_reshape_s_minus_ones_take_the_request_s_variable_dims_in_order():
    # dims [2, -1, -1] reshaped to [1, 2, -1, -1], batched: the request's dims 2 and 3 fill them
    expected = (-1, 2, -1, -1)
    sources = reshape_sources(expected, (1, 2, -1, -1), True)
    assert sources == (2, 3)
    assert model_shape((4, 2, 5, 6), (1, 2, -1, -1), sources, True) == (4, 1, 2, 5, 6)
    # without batching: no batch dimension to keep or skip
    assert reshape_sources((-1, 3), (3, -1), False) == (0,)
    assert model_shape((7, 3), (3, -1), (0,), False) == (3, 7)
    # a reshape without -1 (or none) is as before: the batch dimension and the reshape
    assert reshape_sources((-1, 4), (2, 2), True) == ()
    assert model_shape((3, 4), (2, 2), (), True) == (3, 2, 2)
    assert model_shape((3, 4), None, (), True) == (3, 4)


def test_the_core_stages_the_resolved_shape_and_keys_differing_ones_apart(tmp_path):
    summary = _summary(tmp_path, RESHAPED)
    settings = dynamic_settings(load_model_config(tmp_path / "m"))
    snapshot = Snapshot(packed.snapshot(summary, SLOT, [[], ["V"], False]))
    core_keys = set()
    with OwnedArena(0, initial_bytes=1 << 16, growth_bytes=1 << 16, limit_bytes=1 << 20) as arena:
        for width in (1, 3):
            request = _req("m", _v(2, width))
            record = _core_verdict(summary, request, arena)
            assert isinstance(record, RequestRecord), record
            assert record.inputs[0].shape == (2, width, 1)  # what Triton's model sees
            prepared = prepare(request, snapshot, None)
            assert prepared is not None and prepared.fields is not None
            key = core_key(record, settings)
            assert _call(prepared).shape_key == key  # the worker's key is the core's
            core_keys.add(key)
    assert len(core_keys) == 2  # [2, 1] and [2, 3] never share a batch


def test_the_one_input_key_is_the_general_key():
    for name, dims in (("a", (1, 2)), ("a", ()), ("b", (-1,)), ("é", (1 << 40,))):
        assert one_key(name, dims) == shape_key([(name, dims)])
        assert one_key(name, dims) is one_key(name, dims)  # kept
    for dim in range(core_packed._MAX_KEYS + 10):  # a client sending many shapes: bounded
        assert one_key("x", (dim,)) == shape_key([("x", (dim,))])
        assert len(core_packed._ONE_KEYS) <= core_packed._MAX_KEYS
