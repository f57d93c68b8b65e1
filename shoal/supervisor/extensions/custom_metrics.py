"""Custom metrics that models create with ``pb_utils.MetricFamily`` (exported on /metrics).

Families are shared by name: every instance that creates "requests_total" adds to the same
family, and a metric with the same labels is the same series. A stub refers to families and
metrics by its own ids; when it exits, its handles go, and series nobody holds are dropped.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from shoal.core.errors import InvalidArgument

_KINDS = {0: "counter", 1: "gauge", 2: "histogram"}
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
Labels = tuple[tuple[str, str], ...]


@dataclass
class _Series:
    value: float = 0.0
    bounds: tuple[float, ...] = ()
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    observations: int = 0
    holders: int = 0


@dataclass
class _Family:
    name: str
    description: str
    kind: str
    series: dict[Labels, _Series] = field(default_factory=dict)
    holders: int = 0


class CustomMetrics:
    """The registry of models' custom metric families."""

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}
        self._family_handles: dict[tuple[int, int], _Family] = {}
        self._metric_handles: dict[tuple[int, int], tuple[_Family, Labels]] = {}

    def new_family(self, owner: int, handle: int, name: str, description: str, kind: int) -> None:
        if not _NAME.match(name):
            raise InvalidArgument(
                f"Failed to create metric family. '{name}' is not a valid Prometheus metric name"
            )
        kind_name = _KINDS[kind]
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = _Family(name, description, kind_name)
        elif family.kind != kind_name:
            raise InvalidArgument(
                f"Failed to create metric family. '{name}' already exists as a {family.kind}"
            )
        family.holders += 1
        self._family_handles[(owner, handle)] = family

    def new_metric(
        self,
        owner: int,
        handle: int,
        family_handle: int,
        labels: dict[str, str],
        buckets: list[float] | None,
    ) -> None:
        family = self._family_handles.get((owner, family_handle))
        if family is None:
            raise InvalidArgument("Failed to create metric. Its metric family has been deleted")
        key: Labels = tuple(sorted(labels.items()))
        series = family.series.get(key)
        if series is None:
            bounds = tuple(sorted(buckets or ()))
            series = family.series[key] = _Series(bounds=bounds, counts=[0] * (len(bounds) + 1))
        series.holders += 1
        self._metric_handles[(owner, handle)] = (family, key)

    def _series(self, owner: int, handle: int) -> _Series:
        entry = self._metric_handles.get((owner, handle))
        if entry is None:
            raise InvalidArgument("Invalid metric operation: the metric has been deleted")
        family, key = entry
        return family.series[key]

    def update(self, owner: int, handle: int, op: int, value: float) -> None:
        series = self._series(owner, handle)
        if op == 1:
            series.value += value
        elif op == 2:
            series.value = value
        else:
            _observe(series, value)

    def value(self, owner: int, handle: int) -> float:
        return self._series(owner, handle).value

    def delete_metric(self, owner: int, handle: int) -> None:
        entry = self._metric_handles.pop((owner, handle), None)
        if entry is not None:
            self._release_series(*entry)

    def _release_series(self, family: _Family, key: Labels) -> None:
        series = family.series[key]
        series.holders -= 1
        if series.holders <= 0:
            del family.series[key]
        if family.holders <= 0 and not family.series:  # its family was deleted first
            self._families.pop(family.name, None)

    def delete_family(self, owner: int, handle: int) -> None:
        family = self._family_handles.pop((owner, handle), None)
        if family is not None:
            family.holders -= 1
            if family.holders <= 0 and not family.series:
                self._families.pop(family.name, None)

    def forget(self, owner: int) -> None:
        """A stub exited: drop its handles (and what only it held)."""
        for key in [k for k in self._metric_handles if k[0] == owner]:
            self.delete_metric(*key)
        for key in [k for k in self._family_handles if k[0] == owner]:
            self.delete_family(*key)

    def families(self) -> Iterator[Metric]:
        for family in self._families.values():
            metric = Metric(family.name, family.description, family.kind)
            for key, series in family.series.items():
                labels = dict(key)
                if family.kind != "histogram":
                    metric.add_sample(family.name, labels, series.value)
                    continue
                running = 0
                for bound, count in zip(series.bounds, series.counts, strict=False):
                    running += count
                    metric.add_sample(
                        family.name + "_bucket", {**labels, "le": _le(bound)}, running
                    )
                metric.add_sample(
                    family.name + "_bucket", {**labels, "le": "+Inf"}, series.observations
                )
                metric.add_sample(family.name + "_sum", labels, series.total)
                metric.add_sample(family.name + "_count", labels, series.observations)
            yield metric


def _le(bound: float) -> str:
    """A bucket's bound as Triton's exporter writes it: ``1`` (not ``1.0``), ``0.1``, ``2.5``."""
    value = float(bound)
    return str(int(value)) if value.is_integer() else repr(value)


def _observe(series: _Series, value: float) -> None:
    """A histogram observation: its bucket, sum and count."""
    series.counts[bisect.bisect_left(series.bounds, value)] += 1
    series.total += value
    series.observations += 1
