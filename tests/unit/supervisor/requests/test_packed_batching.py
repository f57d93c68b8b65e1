"""Packed calls for a dynamic-batched model: which models' requests come packed (and which go
straight to a stub), what a worker's snapshot says of the batcher, and the shape key a worker
sends equal to the one the core builds from the same request staged its own way."""

from __future__ import annotations

import asyncio

import pytest

from shoal._serve_parser import build_parser
from shoal.cli import options_from_args
from shoal.config import load_model_config
from shoal.core.packed import shape_key
from shoal.core.types import InferInput, InferRequest
from shoal.frontends.workers.packing import Snapshot, prepare
from shoal.ipc.arena import OwnedArena
from shoal.ipc.records import RequestRecord
from shoal.supervisor.compose import build_service
from shoal.supervisor.instances.loopback import Loopback
from shoal.supervisor.requests import packed
from shoal.supervisor.schedulers._batching import dynamic_settings
from shoal.supervisor.schedulers._batching import shape_key as core_key
from tests.unit.frontends.workers.test_packing import (
    BATCHED,
    BATCHED_CASES,
    SLOT,
    _call,
    _core_verdict,
    _fp32,
    _req,
    _summary,
)

pytestmark = pytest.mark.timeout(30)

HEAD = 'backend: "python"\nmax_batch_size: 8\n'
IO = (
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
)
#: One of each scheduler, and a batcher with priority levels.
MODELS = {
    "plain": HEAD + IO,
    "batched": HEAD + IO + "dynamic_batching { max_queue_delay_microseconds: 100 }\n",
    "fixed": HEAD
    + IO.replace("[ -1 ]", "[ 4 ]")
    + "dynamic_batching { max_queue_delay_microseconds: 100 }\n",
    "levels": HEAD + IO + "dynamic_batching { priority_levels: 2 default_priority_level: 1 }\n",
    "oldest": HEAD
    + IO
    + "sequence_batching { oldest { max_candidate_sequences: 2 } max_sequence_idle_microseconds:"
    " 5000000 }\n",
}


def test_the_key_is_the_same_whatever_the_order_and_tells_names_and_dims_apart():
    assert shape_key([("a", (1, 2)), ("b", ())]) == shape_key([("b", ()), ("a", (1, 2))])
    keys = [
        shape_key([("a", (1, 2))]),
        shape_key([("a", (2, 1))]),
        shape_key([("a", (1,))]),
        shape_key([("b", (1, 2))]),
        shape_key([("a", ()), ("b", ())]),
        shape_key([("ab", ())]),
        shape_key([]),
    ]
    assert len(set(keys)) == len(keys)


def test_keys_built_again_are_the_kept_ones_and_the_kept_ones_stay_bounded():
    from shoal.core import packed as core_packed

    first = shape_key([("a", (3, 4)), ("b", ())])
    again = shape_key([("b", ()), ("a", (3, 4))])
    assert again == first and again is first  # kept, not built again
    for dim in range(core_packed._MAX_KEYS + 10):  # a client sending many shapes
        assert shape_key([("x", (dim,))]) == shape_key([("x", (dim,))])
        assert len(core_packed._KEYS) <= core_packed._MAX_KEYS
    assert shape_key([("a", (3, 4)), ("b", ())]) == first  # built anew once cleared: equal


@pytest.mark.parametrize("request_", [request for request, relays in BATCHED_CASES if relays])
def test_a_packed_request_s_key_is_the_core_s_for_the_same_request(tmp_path, request_):
    # BATCHED has optional inputs and a variable dim (S): every given input counts, S's dims too
    text = BATCHED + "dynamic_batching { }\n"
    summary = _summary(tmp_path, text)
    settings = dynamic_settings(load_model_config(tmp_path / "m"))
    assert settings.has_optional_input and settings.equal_shape_inputs == {"S"}
    batching = [[], sorted(settings.equal_shape_inputs), settings.has_optional_input]
    snapshot = Snapshot(packed.snapshot(summary, SLOT, batching))
    prepared = prepare(request_, snapshot, None)
    assert prepared is not None and prepared.fields is not None
    with OwnedArena(0, initial_bytes=1 << 16, growth_bytes=1 << 16, limit_bytes=1 << 20) as arena:
        record = _core_verdict(summary, request_, arena)
    assert isinstance(record, RequestRecord)
    assert _call(prepared).shape_key == core_key(record, settings)


def test_different_shapes_get_different_keys_and_no_key_is_sent_where_none_counts(tmp_path):
    summary = _summary(tmp_path, BATCHED + "dynamic_batching { }\n")
    snapshot = Snapshot(packed.snapshot(summary, SLOT, [[], ["S"], True]))
    keys = set()
    for strings in ((1, 1), (1, 2)):
        request = _req("m", _fp32("A", (1, 2)), InferInput("S", "BYTES", strings, b""))
        request.inputs[1].data = b"".join(b"\1\0\0\0x" for _ in range(strings[1]))
        prepared = prepare(request, snapshot, None)
        assert prepared is not None
        keys.add(_call(prepared).shape_key)
    keys.add(_call(prepare(_req("m", _fp32("A", (1, 2))), snapshot, None)).shape_key)
    assert len(keys) == 3
    plain = Snapshot(packed.snapshot(summary, SLOT))  # no batcher: no key
    assert _call(prepare(_req("m", _fp32("A", (1, 2))), plain, None)).shape_key == b""


@pytest.fixture
def service(tmp_path):
    for name, text in MODELS.items():
        model = tmp_path / name
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(f'name: "{name}"\n' + text)
        (model / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
        load_model_config(model)  # each is a valid configuration
    args = build_parser().parse_args(["serve", "--model-repository", str(tmp_path)])
    return build_service(options_from_args(args), make_stub=Loopback(lambda name: dict))


def test_which_models_come_packed_and_which_go_straight_to_a_stub(service):
    async def run() -> None:
        await service.load_repository()
        try:
            versions = {name: service.repository.resolve(name, "") for name in MODELS}
            assert {n for n, mv in versions.items() if packed.packable(mv)} == {
                "plain",
                "batched",
                "fixed",
                "levels",
            }
            assert {n for n, mv in versions.items() if packed.direct_eligible(mv)} == {"plain"}
            assert packed.batching(versions["plain"]) == [[], [], False]
            assert packed.batching(versions["batched"]) == [[], ["X"], False]
            assert packed.batching(versions["fixed"]) == [[], [], False]
            assert packed.batching(versions["levels"]) == [["priority"], ["X"], False]
            assert service.packing_summary("oldest", "") is None
            snapshot = Snapshot(service.packing_summary("levels", ""))
            assert snapshot.core_parameters == {"priority"} and snapshot.keyed
            # a request naming its priority goes the core's way; one without is packed
            prioritized = _request("levels", {"priority": 1})
            assert prepare(prioritized, snapshot, None) is None
            assert prepare(_request("levels", {"other": 1}), snapshot, None) is not None
            batched = Snapshot(service.packing_summary("batched", ""))
            assert prepare(prioritized, batched, None) is not None  # no levels: it counts not
            fixed = Snapshot(service.packing_summary("fixed", ""))
            assert not fixed.keyed
        finally:
            await service.shutdown(5.0)

    asyncio.run(run())


def _request(model: str, parameters: dict) -> InferRequest:
    return _req(model, InferInput("X", "FP32", (1, 4), b"\0" * 16), parameters=parameters)
