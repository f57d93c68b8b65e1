"""OpenTelemetry's batch span settings refuse a start as tritonserver's (L0_cmdline_trace)."""

from __future__ import annotations

import pytest

from shoal.supervisor.extensions.otel_settings import check_batch_span_settings
from shoal.supervisor.extensions.trace_settings import parse_trace_config

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("given", "environ", "message"),
    [
        ({}, {"OTEL_BSP_MAX_QUEUE_SIZE": "bad_value"}, '"OTEL_BSP_MAX_QUEUE_SIZE"'),
        ({}, {"OTEL_BSP_SCHEDULE_DELAY": "-"}, '"OTEL_BSP_SCHEDULE_DELAY"'),
        ({}, {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "x1"}, '"OTEL_BSP_MAX_EXPORT_BATCH_SIZE"'),
        (
            {"bsp_max_queue_size": "bad_value"},
            {},
            '"--trace-config opentelemetry,bsp_max_queue_size"',
        ),
        (
            {"bsp_schedule_delay": str(2**64)},
            {"OTEL_BSP_SCHEDULE_DELAY": "5"},
            '"--trace-config opentelemetry,bsp_schedule_delay".\nProvided option value is out',
        ),
    ],
)
def test_a_bad_batch_span_setting_is_a_bad_option(given, environ, message):
    with pytest.raises(ValueError) as info:
        check_batch_span_settings(given, environ)
    assert f"Bad option: {message}" in str(info.value)


def test_good_or_overridden_settings_pass():
    check_batch_span_settings({"bsp_max_queue_size": "2048"}, {"OTEL_BSP_SCHEDULE_DELAY": "10"})
    # read as std::stoul reads them: the leading number, 64 bits
    given = {"bsp_max_queue_size": "12abc", "bsp_schedule_delay": " 1.5"}
    check_batch_span_settings({**given, "bsp_max_export_batch_size": str(2**32)}, {})
    # the flag wins over a bad variable, as in tritonserver
    check_batch_span_settings({"bsp_max_queue_size": "1"}, {"OTEL_BSP_MAX_QUEUE_SIZE": "x"})


def test_only_opentelemetry_mode_checks_them(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "bad_value")
    parse_trace_config(["rate=5", "opentelemetry,url=localhost:4318"])  # triton mode: unused
    with pytest.raises(ValueError, match='Bad option: "OTEL_BSP_MAX_QUEUE_SIZE"'):
        parse_trace_config(["mode=opentelemetry"])
    monkeypatch.delenv("OTEL_BSP_MAX_QUEUE_SIZE")
    with pytest.raises(ValueError, match="opentelemetry,bsp_max_export_batch_size"):
        parse_trace_config(["mode=opentelemetry", "opentelemetry,bsp_max_export_batch_size=x"])
