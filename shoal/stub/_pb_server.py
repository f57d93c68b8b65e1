"""Server services a model can call: model directory, model control, custom metrics."""

from __future__ import annotations

import enum
from typing import Any, NoReturn, Protocol

from shoal.stub._pb_errors import TritonModelException

_METRICS_UNSUPPORTED = "custom metrics are not supported yet by shoal"
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
    version = -1
    if model_version:
        try:
            version = int(model_version)
        except ValueError:
            version = -2
        if version < 0:
            raise TritonModelException(
                f"Failed to parse model version '{model_version}': it must be an integer >= 0"
            )
    return controller.is_model_ready(model_name, version)


class _MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


def _metrics_unsupported() -> NoReturn:
    raise TritonModelException(_METRICS_UNSUPPORTED)


class MetricFamily:
    """A custom metric family. Not supported yet: constructing one raises TritonModelException."""

    COUNTER = _MetricKind.COUNTER
    GAUGE = _MetricKind.GAUGE
    HISTOGRAM = _MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        _metrics_unsupported()

    def Metric(self, labels: dict[str, str] | None = None, buckets: Any = None) -> Metric:
        """A metric of this family (Triton's API; unreachable until metrics are supported)."""
        _metrics_unsupported()


class Metric:
    """A custom metric. Not supported yet: constructing one raises TritonModelException."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _metrics_unsupported()
