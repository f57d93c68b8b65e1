"""Which instances an in-place update keeps, starts and stops (Triton's instance signatures)."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from shoal.protos import model_config_pb2 as pb
from shoal.supervisor.models.instance_update import plan_update, wanted_instances

pytestmark = pytest.mark.timeout(10)


def _config(groups: str) -> pb.ModelConfig:
    return text_format.Parse(f"name: 'm' instance_group [ {groups} ]", pb.ModelConfig())


def _current(groups: str) -> list[tuple[str, bytes]]:
    return [(w.name, w.key) for w in wanted_instances(_config(groups))]


CPU3 = "{ name: 'a' count: 3 kind: KIND_CPU }"


def test_a_larger_count_keeps_every_instance_and_adds_one() -> None:
    plan = plan_update(_current(CPU3), wanted_instances(_config(CPU3.replace("3", "4"))))
    assert plan.reuse == [0, 1, 2, None] and plan.removed == []


def test_a_smaller_count_stops_only_the_instances_left_over() -> None:
    plan = plan_update(_current(CPU3), wanted_instances(_config(CPU3.replace("3", "1"))))
    assert plan.reuse == [0] and plan.removed == [1, 2]


def test_names_and_the_split_into_groups_do_not_matter() -> None:
    split = "{ name: 'x' count: 1 kind: KIND_CPU }, { name: 'y' count: 2 kind: KIND_CPU }"
    plan = plan_update(_current(CPU3), wanted_instances(_config(split)))
    assert sorted(i for i in plan.reuse if i is not None) == [0, 1, 2]
    assert not plan.changes


def test_kind_device_and_rate_limiter_make_a_different_instance() -> None:
    for other in (
        "{ name: 'a' count: 3 kind: KIND_GPU gpus: [ 0 ] }",
        "{ name: 'a' count: 3 kind: KIND_CPU rate_limiter { resources { name: 'R' count: 2 } } }",
        "{ name: 'a' count: 3 kind: KIND_CPU passive: true }",
    ):
        plan = plan_update(_current(CPU3), wanted_instances(_config(other)))
        assert plan.reuse == [None, None, None] and plan.removed == [0, 1, 2], other
    # One instance per device of ``gpus``: a larger count adds one on each.
    gpus = "{ name: 'g' count: 1 kind: KIND_GPU gpus: [ 0, 1 ] }"
    plan = plan_update(_current(gpus), wanted_instances(_config(gpus.replace("1 kind", "2 kind"))))
    assert plan.reuse == [0, 1, None, None] and plan.removed == []
