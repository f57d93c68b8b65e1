"""Metric families and their text exposition, from statistics built by hand (docs/metrics.md)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shoal._serve_parser import build_parser
from shoal.cli import options_from_args
from shoal.core.types import ModelStatistics, StatDuration
from shoal.supervisor.extensions._metrics_families import (
    ArenaSample,
    InstanceSample,
    ModelSample,
    render_text,
    shoal_families,
    triton_families,
)
from shoal.supervisor.extensions._metrics_rss import RssProbe, read_rss_bytes
from shoal.supervisor.extensions.custom_metrics import CustomMetrics
from shoal.supervisor.extensions.metrics import MetricsExporter
from shoal.supervisor.memory.cuda_pools import CudaPools

pytestmark = pytest.mark.timeout(30)

PAGE = os.sysconf("SC_PAGE_SIZE")


def _stats(name="add_sub", version="1", *, success=3, failed=1) -> ModelStatistics:
    stats = ModelStatistics(name=name, version=version, inference_count=success)
    stats.execution_count = success
    infer = stats.inference_stats
    infer.success = StatDuration(success, 4_500_999)
    infer.fail = StatDuration(failed, 70_000)
    infer.queue = StatDuration(success, 30_000)
    infer.compute_input = StatDuration(success, 12_345)
    infer.compute_infer = StatDuration(success, 1_000_999)
    infer.compute_output = StatDuration(success, 999)
    stats.failure_reasons = {"OTHER": failed} if failed else {}
    return stats


def _render(models=(), instances=(), arenas=()) -> str:
    families = [*triton_families(list(models)), *shoal_families(list(instances), list(arenas))]
    return render_text(families).decode()


# --- Triton's families ---------------------------------------------------------------------------

TRITON_TEXT = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="add_sub",version="1"} 3
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="add_sub",reason="OTHER",version="1"} 1
nv_inference_request_failure{model="add_sub",reason="BACKEND",version="1"} 0
nv_inference_request_failure{model="add_sub",reason="CANCELED",version="1"} 0
nv_inference_request_failure{model="add_sub",reason="REJECTED",version="1"} 0
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{model="add_sub",version="1"} 3
# HELP nv_inference_exec_count Number of model executions performed (does not include cached requests)
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="add_sub",version="1"} 3
# HELP nv_inference_request_duration_us Cumulative inference request duration in microseconds (includes cached requests)
# TYPE nv_inference_request_duration_us counter
nv_inference_request_duration_us{model="add_sub",version="1"} 4500
# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds (includes cached requests)
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="add_sub",version="1"} 30
# HELP nv_inference_compute_input_duration_us Cumulative compute input duration in microseconds (does not include cached requests)
# TYPE nv_inference_compute_input_duration_us counter
nv_inference_compute_input_duration_us{model="add_sub",version="1"} 12
# HELP nv_inference_compute_infer_duration_us Cumulative compute inference duration in microseconds (does not include cached requests)
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{model="add_sub",version="1"} 1000
# HELP nv_inference_compute_output_duration_us Cumulative inference compute output duration in microseconds (does not include cached requests)
# TYPE nv_inference_compute_output_duration_us counter
nv_inference_compute_output_duration_us{model="add_sub",version="1"} 0
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="add_sub",version="1"} 2
"""  # noqa: E501  (Triton's HELP lines are long)


def test_triton_families_render_exactly_as_triton_prints_them():
    assert _render([ModelSample(_stats(), pending=2)]) == TRITON_TEXT


def test_counter_names_have_no_total_suffix_and_parse_as_counters():
    text = _render([ModelSample(_stats())])
    assert "_total" not in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["nv_inference_request_success"].type == "counter"
    assert families["nv_inference_compute_infer_duration_us"].type == "counter"
    assert families["nv_inference_pending_request_count"].type == "gauge"
    assert len(families) == 10


def test_one_sample_per_model_version():
    models = [
        ModelSample(_stats("add_sub", "1", success=2, failed=0)),
        ModelSample(_stats("add_sub", "2", success=5, failed=3), pending=4),
        ModelSample(_stats("identity", "1", success=0, failed=0)),
    ]
    text = _render(models)
    assert 'nv_inference_request_success{model="add_sub",version="1"} 2\n' in text
    assert 'nv_inference_request_success{model="add_sub",version="2"} 5\n' in text
    assert 'nv_inference_request_success{model="identity",version="1"} 0\n' in text
    assert 'nv_inference_request_failure{model="add_sub",reason="OTHER",version="2"} 3\n' in text
    assert 'nv_inference_pending_request_count{model="add_sub",version="2"} 4\n' in text
    assert text.count("nv_inference_request_failure{") == 3 * 4


def test_cache_counters_only_for_versions_that_use_the_cache():
    cached = _stats("cached", "1")
    cached.inference_stats.cache_hit = StatDuration(4, 7_999)
    cached.inference_stats.cache_miss = StatDuration(2, 3_000)
    text = _render([ModelSample(cached, cached=True), ModelSample(_stats("plain", "1"))])
    labels = '{model="cached",version="1"}'
    assert f"nv_cache_num_hits_per_model{labels} 4\n" in text
    assert f"nv_cache_hit_duration_per_model{labels} 7\n" in text
    assert f"nv_cache_num_misses_per_model{labels} 2\n" in text
    assert f"nv_cache_miss_duration_per_model{labels} 3\n" in text
    assert 'nv_cache_num_hits_per_model{model="plain"' not in text
    order = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    cache_at = order.index("nv_cache_num_hits_per_model")
    assert order[cache_at - 1] == "nv_inference_compute_output_duration_us"
    assert order[cache_at + 4] == "nv_inference_pending_request_count"
    assert "nv_cache" not in _render([ModelSample(_stats("plain", "1"))])


def test_failures_are_counted_under_their_reason():
    stats = _stats(failed=6)
    stats.failure_reasons = {"REJECTED": 3, "BACKEND": 2, "CANCELED": 1}
    text = _render([ModelSample(stats)])
    for reason, count in (("OTHER", 0), ("BACKEND", 2), ("CANCELED", 1), ("REJECTED", 3)):
        line = f'nv_inference_request_failure{{model="add_sub",reason="{reason}",version="1"}}'
        assert f"{line} {count}\n" in text


def test_no_models_no_triton_families():
    assert _render() == ""


# --- shoal's families ----------------------------------------------------------------------------


def test_instance_and_arena_families():
    instances = [
        InstanceSample("add_sub", "1", "add_sub_0_0", ready=True, restarts=0, rss_bytes=4096),
        InstanceSample("crasher", "1", "crasher_0_1", ready=False, restarts=2, rss_bytes=None),
    ]
    text = _render(instances=instances, arenas=[ArenaSample("input", 128, 1 << 20)])
    expected = [
        "# TYPE shoal_instance_restarts_total counter",
        'shoal_instance_restarts_total{instance="add_sub_0_0",model="add_sub",version="1"} 0',
        'shoal_instance_restarts_total{instance="crasher_0_1",model="crasher",version="1"} 2',
        "# TYPE shoal_instance_ready gauge",
        'shoal_instance_ready{instance="add_sub_0_0",model="add_sub",version="1"} 1',
        'shoal_instance_ready{instance="crasher_0_1",model="crasher",version="1"} 0',
        "# TYPE shoal_stub_rss_bytes gauge",
        'shoal_stub_rss_bytes{instance="add_sub_0_0",model="add_sub",version="1"} 4096',
        "# TYPE shoal_arena_used_bytes gauge",
        'shoal_arena_used_bytes{arena="input"} 128',
        "# TYPE shoal_arena_capacity_bytes gauge",
        'shoal_arena_capacity_bytes{arena="input"} 1048576',
    ]
    lines = [line for line in text.splitlines() if not line.startswith("# HELP")]
    assert lines == expected  # the dead stub has no RSS sample
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    assert parsed["shoal_instance_restarts"].type == "counter"


# --- the exposition format -----------------------------------------------------------------------


def test_label_values_and_help_are_escaped():
    weird = 'a"b\\c\nd'
    text = _render([ModelSample(_stats(name=weird))])
    assert 'nv_inference_count{model="a\\"b\\\\c\\nd",version="1"} 3\n' in text
    (family,) = [
        f for f in text_string_to_metric_families(text) if f.name == "nv_inference_exec_count"
    ]
    assert family.samples[0].labels["model"] == weird


def test_non_integral_values_keep_their_fraction():
    from prometheus_client.metrics_core import Metric

    family = Metric("x", "help\nwith newline", "gauge")
    family.add_sample("x", {}, 0.25)
    family.add_sample("x", {"k": "v"}, float("inf"))
    assert (
        render_text([family])
        == b'# HELP x help\\nwith newline\n# TYPE x gauge\nx 0.25\nx{k="v"} +Inf\n'
    )


# --- RSS -----------------------------------------------------------------------------------------


def test_rss_of_this_process_is_positive():
    rss = read_rss_bytes(os.getpid())
    assert rss is not None and rss > 0


def test_rss_is_reused_within_the_interval(tmp_path):
    statm = tmp_path / "42" / "statm"
    statm.parent.mkdir()
    statm.write_text("1000 25 10 1 0 30 0\n")
    now = [100.0]
    probe = RssProbe(2.0, clock=lambda: now[0], proc_root=str(tmp_path))
    assert probe.rss_bytes(42) == 25 * PAGE
    statm.write_text("1000 26 10 1 0 30 0\n")
    now[0] += 1.9
    assert probe.rss_bytes(42) == 25 * PAGE  # cached
    now[0] += 0.1
    assert probe.rss_bytes(42) == 26 * PAGE  # the interval has passed
    assert probe.rss_bytes(43) is None  # no such process


def test_rss_readings_of_gone_processes_are_forgotten(tmp_path):
    statm = tmp_path / "7" / "statm"
    statm.parent.mkdir()
    statm.write_text("1 3 0 0 0 0 0\n")
    probe = RssProbe(60.0, clock=lambda: 0.0, proc_root=str(tmp_path))
    assert probe.rss_bytes(7) == 3 * PAGE
    statm.write_text("1 4 0 0 0 0 0\n")
    probe.keep_only([8])
    assert probe.rss_bytes(7) == 4 * PAGE  # read afresh, not from the old cache


# --- the collector over a stand-in service -------------------------------------------------------


def _instance(name, *, ready=True, restarts=0, pid=-1):
    return SimpleNamespace(name=name, ready=ready, restarts=restarts, pid=pid)


def _version(name, version, *, ready=True, pending=0, instances=()):
    return SimpleNamespace(
        name=name,
        version=version,
        ready=ready,
        scheduler=SimpleNamespace(pending=pending),
        instances=list(instances),
        stats=SimpleNamespace(overhead=None, latencies=None),  # no --trace-overhead, summaries
    )


def _service(versions):
    stats = [_stats(mv.name, str(mv.version)) for mv in versions if mv.ready]
    return SimpleNamespace(
        repository=SimpleNamespace(versions=lambda: iter(versions)),
        input_arena=SimpleNamespace(used_bytes=640, capacity_bytes=1 << 26),
        directory=SimpleNamespace(cuda=CudaPools()),  # no GPU tensor yet: no pool families
        model_statistics=lambda: stats,
        custom_metrics=CustomMetrics(),
        cache=None,  # no --cache-config
    )


def test_exporter_reads_queues_instances_and_the_input_arena():
    versions = [
        _version("add_sub", 1, pending=3, instances=[_instance("add_sub_0_0", pid=os.getpid())]),
        _version("crasher", 1, instances=[_instance("crasher_0_0", ready=False, restarts=1)]),
        _version("old", 1, ready=False, instances=[_instance("old_0_0")]),
    ]
    text = MetricsExporter(_service(versions), interval_ms=500).render().decode()
    assert 'nv_inference_pending_request_count{model="add_sub",version="1"} 3\n' in text
    assert 'nv_inference_pending_request_count{model="crasher",version="1"} 0\n' in text
    assert 'shoal_instance_ready{instance="crasher_0_0",model="crasher",version="1"} 0\n' in text
    assert 'shoal_instance_restarts_total{instance="crasher_0_0",model="crasher",' in text
    assert 'shoal_stub_rss_bytes{instance="add_sub_0_0",model="add_sub",version="1"} ' in text
    assert 'shoal_stub_rss_bytes{instance="crasher_0_0"' not in text  # no live process
    assert 'model="old"' not in text  # versions that are not ready are not reported
    assert 'shoal_arena_used_bytes{arena="input"} 640\n' in text
    assert 'shoal_arena_capacity_bytes{arena="input"} 67108864\n' in text
    assert "shoal_cuda_pool" not in text


def test_exporter_without_models_reports_the_arena_first():
    text = MetricsExporter(_service([])).render().decode()
    assert text.startswith("# HELP shoal_arena_used_bytes ")


# --- flags ---------------------------------------------------------------------------------------


def _options(*flags):
    return options_from_args(
        build_parser().parse_args(["serve", "--model-repository", "r", *flags])
    )


def test_metrics_flags():
    assert _options().metrics_interval_ms == 2000
    options = _options(
        "--metrics-interval-ms",
        "500",
        "--allow-gpu-metrics",
        "false",
        "--allow-cpu-metrics",
        "true",
    )
    assert options.metrics_interval_ms == 500
    assert not _options("--allow-metrics", "false").allow_metrics


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_metrics_interval_must_be_positive(value, capsys):
    with pytest.raises(SystemExit):
        _options("--metrics-interval-ms", value)
    assert "expected a positive integer" in capsys.readouterr().err
