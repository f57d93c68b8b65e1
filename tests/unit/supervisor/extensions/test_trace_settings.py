"""The trace settings store: Triton's copy-from-global and clear-to-global rules, and checks."""

from __future__ import annotations

import json
import re

import pytest

from shoal.core.errors import InvalidArgument, Unsupported
from shoal.supervisor.extensions.trace_settings import (
    DEFAULTS,
    TraceSettings,
    _level,
    parse_trace_config,
)

pytestmark = pytest.mark.timeout(10)


def test_a_model_follows_the_global_settings_until_it_sets_its_own():
    settings = TraceSettings()
    assert settings.current() == dict(DEFAULTS)
    settings.update({"trace_rate": 50})
    assert settings.current("m")["trace_rate"] == "50"
    settings.update({"trace_rate": "5", "log_frequency": "2"}, model="m")
    settings.update({"trace_rate": "60", "trace_count": "3"})
    mine = settings.current("m")
    assert mine["trace_rate"] == "5" and mine["trace_count"] == "3"
    assert settings.update({"trace_rate": None}, model="m")["trace_rate"] == "60"
    settings.update({"log_frequency": None}, model="m")
    assert settings.current("m") == settings.current()


def test_a_cleared_global_setting_goes_back_to_its_value_at_start_as_in_triton():
    settings = TraceSettings(initial={"trace_rate": "6", "trace_count": "4"})
    settings.update({"trace_rate": "56", "trace_count": "78", "log_frequency": "3"})
    assert settings.current("m")["trace_rate"] == "56"
    cleared = settings.update({"trace_rate": None, "trace_count": None, "log_frequency": None})
    assert cleared == {**DEFAULTS, "trace_rate": "6", "trace_count": "4"}
    assert settings.current("m") == cleared  # a model without its own follows the global ones


def test_levels_are_read_in_tritons_order_and_off_with_another_means_that_one():
    assert _level(["TENSORS", "TIMESTAMPS"]) == ["TIMESTAMPS", "TENSORS"]
    assert _level(["OFF", "TIMESTAMPS"]) == ["TIMESTAMPS"]
    assert _level("OFF") == ["OFF"]
    assert TraceSettings().update({"trace_level": "OFF"})["trace_level"] == ["OFF"]


@pytest.mark.parametrize("model", ["", "m"])
def test_a_level_other_than_off_needs_a_trace_file_as_in_triton(model):
    settings = TraceSettings()
    with pytest.raises(InvalidArgument, match="trace file name is not given"):
        settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "9"}, model=model)
    assert settings.current(model) == dict(DEFAULTS)  # nothing of the request applied


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"trace_level": []}, InvalidArgument, "must be a list of strings"),
        ({"trace_level": ["OFF", 3]}, InvalidArgument, "must be a list of strings"),
        ({"trace_count": "-2"}, InvalidArgument, "'trace_count' must be at least -1, got -2"),
        ({"log_frequency": True}, InvalidArgument, "'log_frequency' must be an integer"),
        ({"trace_mode": "opentelemetry"}, Unsupported, "trace mode can not be updated"),
        ({"trace_rate": "1", "bogus": "1"}, InvalidArgument, "unknown trace setting 'bogus'"),
    ],
)
def test_bad_changes_are_refused_and_change_nothing(changes, error, message):
    settings = TraceSettings()
    with pytest.raises(error, match=message):
        settings.update(changes)
    assert settings.current() == dict(DEFAULTS)


def test_unchanged_fixed_settings_are_accepted_and_models_must_exist():
    settings = TraceSettings(lambda name: name == "known")
    assert settings.update({"trace_file": "", "trace_mode": "triton"}) == dict(DEFAULTS)
    with pytest.raises(InvalidArgument, match=r"Request for unknown model : other$"):
        settings.current("other")
    assert settings.current("known") == dict(DEFAULTS)


def test_no_trace_context_while_tracing_is_off():
    settings = TraceSettings()
    assert [settings.context_for("m") for _ in range(3)] == ["", "", ""]


def test_one_request_in_every_trace_rate_gets_a_context_up_to_trace_count():
    settings = TraceSettings(
        initial={"trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_count": "2"}
    )
    contexts = [settings.context_for("m") for _ in range(7)]
    traced = [i for i, context in enumerate(contexts) if context]
    # Triton's sampling: the second and the fourth (every trace_rate-th), two at most, and
    # trace_count is reported as it runs down.
    assert traced == [1, 3]
    assert settings.current()["trace_count"] == "0"
    parent = json.loads(contexts[1])["traceparent"]
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", parent)
    assert contexts[1] != contexts[3]


def test_trace_config_flags_give_the_initial_settings():
    settings = parse_trace_config(
        [
            "triton,file=/tmp/trace.json",
            "level=TIMESTAMPS",
            "level=TENSORS",
            "rate=10",
            "count=-1",
            "mode=opentelemetry",
            "opentelemetry,url=localhost:4318/v1/traces",
        ]
    )
    assert settings == {
        "trace_file": "/tmp/trace.json",
        "trace_level": ["TIMESTAMPS", "TENSORS"],
        "trace_rate": "10",
        "trace_count": "-1",
        "trace_mode": "opentelemetry",
    }
    for bad in ("level", "rate=0", "colour=red", "mode=zipkin", "jaeger,url=x"):
        with pytest.raises(ValueError, match="--trace-config"):
            parse_trace_config([bad])
