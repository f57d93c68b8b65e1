"""Built-in model classes for models that have no ``model.py``.

A model whose configuration names one of these backends runs in an ordinary stub, like a Python
model, but the stub creates the backend's model class instead of importing ``model.py``. The
class has the Python backend's ``initialize(args)`` / ``execute(requests)`` / ``finalize()``, so
the runtime, the executor and every scheduler treat it like any other model.

Each backend module is imported only when a model uses it, so that its framework (onnxruntime,
torch) stays an optional dependency.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from typing import Any

#: backend name in config.pbtxt -> module under shoal.stub.backends with a ``create_model``.
BUILTIN_BACKENDS: dict[str, str] = {
    "onnxruntime": "shoal.stub.backends.onnxruntime",
    "pytorch": "shoal.stub.backends.pytorch",
}
#: platforms that imply one of the backends above when the configuration names no backend.
_PLATFORMS: dict[str, str] = {"onnxruntime_onnx": "onnxruntime", "pytorch_libtorch": "pytorch"}


def builtin_backend(args: Mapping[str, str]) -> str | None:
    """The built-in backend that runs the model of these ``initialize`` args, if any."""
    try:
        config = json.loads(args.get("model_config", "{}"))
    except ValueError:
        return None
    if not isinstance(config, dict):
        return None
    backend = config.get("backend") or _PLATFORMS.get(config.get("platform") or "", "")
    return backend if backend in BUILTIN_BACKENDS else None


def create_model(backend: str, model_file: str) -> Any:
    """A new model object of the built-in ``backend`` for ``model_file``."""
    module = importlib.import_module(BUILTIN_BACKENDS[backend])
    return module.create_model(model_file)


__all__ = ["BUILTIN_BACKENDS", "builtin_backend", "create_model"]
