"""Server services: model directory, model control and custom metrics."""

from __future__ import annotations

import re

import pytest

from shoal.stub import pb_utils
from shoal.stub.pb_utils import TritonModelException


def test_get_model_dir():
    with pytest.raises(TritonModelException):
        pb_utils.get_model_dir()
    pb_utils._set_model_dir("/models/add/1")
    assert pb_utils.get_model_dir() == "/models/add/1"


def test_metrics_need_a_backend():
    with pytest.raises(TritonModelException, match="no metrics backend"):
        pb_utils.MetricFamily("requests", "count of requests", pb_utils.MetricFamily.COUNTER)


class _Backend:
    """An in-memory metrics backend: a double of the supervisor's registry."""

    def __init__(self):
        self.values = {}
        self.deleted = []

    def new_family(self, name, description, kind):
        return len(self.values) + 100

    def new_metric(self, family, labels, buckets):
        metric = len(self.values) + 1
        self.values[metric] = 0.0
        return metric

    def update(self, metric, op, value):
        self.values[metric] = value if op == "set" else self.values[metric] + value

    def value(self, metric):
        return self.values[metric]

    def delete_metric(self, metric):
        self.deleted.append(metric)

    def delete_family(self, family):
        self.deleted.append(family)


def test_metric_rules_follow_triton():
    backend = _Backend()
    pb_utils._set_metrics_backend(backend)
    try:
        family = pb_utils.MetricFamily("c", "d", pb_utils.MetricFamily.COUNTER)
        counter = family.Metric({"a": "1"})
        counter.increment(2)
        counter.increment(3)
        assert counter.value() == 5
        with pytest.raises(TritonModelException, match="Counters only increase"):
            counter.increment(-1)
        with pytest.raises(TritonModelException, match="Only gauges"):
            counter.set(1)
        histogram = pb_utils.MetricFamily("h", "d", pb_utils.MetricFamily.HISTOGRAM)
        with pytest.raises(TritonModelException, match="needs buckets"):
            histogram.Metric()
        with pytest.raises(TritonModelException, match="Only histogram metrics take buckets"):
            pb_utils.MetricFamily("g", "d", pb_utils.MetricFamily.GAUGE).Metric(buckets=[1])
        with pytest.raises(TritonModelException, match="labels must be a dict"):
            histogram.Metric(labels=["x"], buckets=[1])
    finally:
        pb_utils._set_metrics_backend(None)


@pytest.mark.parametrize("buckets", [[2.5, 0.1, 1.0], [1, 1, 2], [1.0, 0.5]])
def test_histogram_buckets_must_ascend_strictly(buckets):
    pb_utils._set_metrics_backend(_Backend())
    try:
        histogram = pb_utils.MetricFamily("h", "d", pb_utils.MetricFamily.HISTOGRAM)
        with pytest.raises(TritonModelException, match="strictly ascending"):
            histogram.Metric(buckets=buckets)
        histogram.Metric(buckets=[])  # no bucket but +Inf: allowed, as in Triton
    finally:
        pb_utils._set_metrics_backend(None)


def test_a_metric_whose_family_was_deleted_raises_as_in_triton():
    pb_utils._set_metrics_backend(_Backend())
    try:
        family = pb_utils.MetricFamily("g", "d", pb_utils.MetricFamily.GAUGE)
        gauge = family.Metric({"a": "1"})
        gauge.set(3)
        del family
        gone = "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."
        for operation in (lambda: gauge.set(1), lambda: gauge.increment(1), gauge.value):
            with pytest.raises(TritonModelException, match=re.escape(gone)):
                operation()
    finally:
        pb_utils._set_metrics_backend(None)


def test_metric_kinds_exist():
    family = pb_utils.MetricFamily
    assert (family.COUNTER, family.GAUGE, family.HISTOGRAM) == (0, 1, 2)


@pytest.mark.parametrize(
    "call",
    [
        lambda: pb_utils.load_model("m"),
        lambda: pb_utils.unload_model("m"),
        lambda: pb_utils.is_model_ready("m"),
    ],
)
def test_model_control_is_not_supported_without_a_hook(call):
    with pytest.raises(TritonModelException, match=r"model control"):
        call()


class _Controller:
    def __init__(self):
        self.calls = []

    def load_model(self, model_name, config, files):
        self.calls.append(("load", model_name, config, files))

    def unload_model(self, model_name, unload_dependents):
        self.calls.append(("unload", model_name, unload_dependents))

    def is_model_ready(self, model_name, model_version):
        self.calls.append(("ready", model_name, model_version))
        return True


def test_model_control_delegates_to_the_hook():
    controller = _Controller()
    pb_utils._set_model_controller(controller)
    pb_utils.load_model("m", config='{"backend": "python"}', files={"file:1/model.py": b"x"})
    pb_utils.load_model("n")
    pb_utils.unload_model("m", unload_dependents=True)
    assert pb_utils.is_model_ready("m") is True
    assert pb_utils.is_model_ready("m", "3") is True
    assert controller.calls == [
        ("load", "m", '{"backend": "python"}', {"file:1/model.py": b"x"}),
        ("load", "n", "", {}),
        ("unload", "m", True),
        ("ready", "m", -1),
        ("ready", "m", 3),
    ]


def test_load_model_files_need_a_config():
    pb_utils._set_model_controller(_Controller())
    with pytest.raises(TritonModelException, match="config"):
        pb_utils.load_model("m", files={"file:1/model.py": b"x"})


@pytest.mark.parametrize("version", ["-1", "one", "1.5"])
def test_is_model_ready_version_must_be_a_non_negative_integer(version):
    pb_utils._set_model_controller(_Controller())
    with pytest.raises(TritonModelException, match="version"):
        pb_utils.is_model_ready("m", version)
