"""Server services a model can call: model directory, model control, custom metrics."""

from __future__ import annotations

import enum
import itertools
import weakref
from typing import Any, Protocol

from shoal.stub._pb_errors import TritonModelException

_METRICS_UNSUPPORTED = (
    "custom metrics are available only inside a model served by shoal (no metrics backend)"
)
_MODEL_CONTROL_UNSUPPORTED = (
    "model control (load_model, unload_model, is_model_ready) is not supported yet by shoal"
)

_model_dir: str | None = None


def _set_model_dir(path: str | None) -> None:
    """Set what ``get_model_dir()`` returns (the model's version directory); ``None`` unsets."""
    global _model_dir
    _model_dir = path


def get_model_dir() -> str:
    """The directory that holds the model's ``model.py`` (its version directory)."""
    if _model_dir is None:
        raise TritonModelException("get_model_dir() is not available before the model is loaded")
    return _model_dir


class ModelController(Protocol):
    """What the runtime installs with ``_set_model_controller`` once model control exists."""

    def load_model(self, model_name: str, config: str, files: dict[str, bytes]) -> None: ...

    def unload_model(self, model_name: str, unload_dependents: bool) -> None: ...

    def is_model_ready(self, model_name: str, model_version: int) -> bool: ...


_controller: ModelController | None = None


def _set_model_controller(controller: ModelController | None) -> None:
    """Install (or with ``None`` remove) the object the model-control functions delegate to."""
    global _controller
    _controller = controller


def _model_controller() -> ModelController:
    controller = _controller
    if controller is None:
        raise TritonModelException(_MODEL_CONTROL_UNSUPPORTED)
    return controller


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load or reload ``model_name``; ``config`` is a JSON override, ``files`` needs ``config``."""
    controller = _model_controller()
    if files and not config:
        raise TritonModelException("Failed to load model: 'files' requires a 'config' override")
    controller.load_model(model_name, config, dict(files or {}))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload ``model_name`` (and, with ``unload_dependents``, the models that depend on it)."""
    _model_controller().unload_model(model_name, bool(unload_dependents))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether ``model_name`` (``model_version``; ``""``: the latest) is ready."""
    controller = _model_controller()
    version = _version_number(model_version) if model_version else -1
    return controller.is_model_ready(model_name, version)


def _version_number(model_version: str) -> int:
    try:
        version = int(model_version)
    except ValueError:
        version = -2
    if version < 0:
        raise TritonModelException(
            f"Failed to parse model version '{model_version}': it must be an integer >= 0"
        )
    return version


class _MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class MetricsBackend(Protocol):
    """What the runtime installs with ``_set_metrics_backend``: the supervisor's registry."""

    def new_family(self, name: str, description: str, kind: int) -> int: ...

    def new_metric(
        self, family: int, labels: dict[str, str], buckets: list[float] | None
    ) -> int: ...

    def update(self, metric: int, op: str, value: float) -> None: ...

    def value(self, metric: int) -> float: ...

    def delete_metric(self, metric: int) -> None: ...

    def delete_family(self, family: int) -> None: ...


_metrics: MetricsBackend | None = None


def _set_metrics_backend(backend: MetricsBackend | None) -> None:
    """Install (or with ``None`` remove) the registry custom metrics live in."""
    global _metrics
    _metrics = backend


def _metrics_backend() -> MetricsBackend:
    if _metrics is None:
        raise TritonModelException(_METRICS_UNSUPPORTED)
    return _metrics


class MetricFamily:
    """A custom metric family (``COUNTER``, ``GAUGE`` or ``HISTOGRAM``), exported on /metrics."""

    COUNTER = _MetricKind.COUNTER
    GAUGE = _MetricKind.GAUGE
    HISTOGRAM = _MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        if kind not in (0, 1, 2):
            raise TritonModelException(
                "Failed to create metric family. Metric kind must be MetricFamily.COUNTER, "
                "GAUGE or HISTOGRAM"
            )
        self._backend = _metrics_backend()
        self._kind = _MetricKind(kind)
        self._id = self._backend.new_family(str(name), str(description), int(kind))

    def Metric(self, labels: dict[str, str] | None = None, buckets: Any = None) -> Metric:
        """A metric of this family with ``labels``; ``buckets`` only (and always) for histograms."""
        return Metric(self, labels, buckets)

    def __del__(self) -> None:
        backend = getattr(self, "_backend", None)
        if backend is not None:
            try:
                backend.delete_family(self._id)
            except Exception:
                pass


class Metric:
    """One labelled series of a :class:`MetricFamily`."""

    def __init__(
        self, family: MetricFamily, labels: dict[str, str] | None = None, buckets: Any = None
    ) -> None:
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. labels must be a dict")
        histogram = family._kind is _MetricKind.HISTOGRAM
        if histogram and buckets is None:
            raise TritonModelException(
                "Failed to create metric. Histogram metric needs buckets: pass buckets=[...]"
            )
        if not histogram and buckets is not None:
            raise TritonModelException(
                "Failed to create metric. Only histogram metrics take buckets"
            )
        bounds = None if buckets is None else [float(b) for b in buckets]
        if bounds and any(high <= low for low, high in itertools.pairwise(bounds)):
            raise TritonModelException(
                f"Failed to create metric. Histogram buckets must be in strictly ascending "
                f"order, got {bounds}"
            )
        # As in Triton, a metric does not keep its family alive: once the model drops the
        # family (and the server with it), the metric's operations raise.
        self._family = weakref.ref(family)
        self._backend = family._backend
        self._kind = family._kind
        values = {str(k): str(v) for k, v in (labels or {}).items()}
        self._id = family._backend.new_metric(family._id, values, bounds)

    def _check_family(self) -> None:
        if self._family() is None:
            raise TritonModelException(
                "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."
            )

    def increment(self, value: float) -> None:
        if self._kind is _MetricKind.HISTOGRAM:
            raise TritonModelException(
                "Failed to increment metric value. Use observe() on a histogram"
            )
        if self._kind is _MetricKind.COUNTER and value < 0:
            raise TritonModelException(
                "Failed to increment metric value. Counters only increase: the value must be >= 0"
            )
        self._check_family()
        self._backend.update(self._id, "increment", float(value))

    def set(self, value: float) -> None:
        if self._kind is not _MetricKind.GAUGE:
            raise TritonModelException("Failed to set metric value. Only gauges can be set")
        self._check_family()
        self._backend.update(self._id, "set", float(value))

    def observe(self, value: float) -> None:
        if self._kind is not _MetricKind.HISTOGRAM:
            raise TritonModelException(
                "Failed to observe metric value. Only histograms take observations"
            )
        self._check_family()
        self._backend.update(self._id, "observe", float(value))

    def value(self) -> float:
        if self._kind is _MetricKind.HISTOGRAM:
            raise TritonModelException(
                "Failed to get metric value. Histograms have no single value"
            )
        self._check_family()
        return float(self._backend.value(self._id))

    def __del__(self) -> None:
        backend = getattr(self, "_backend", None)
        if backend is not None:
            try:
                backend.delete_metric(self._id)
            except Exception:
                pass
