"""Import a user's ``model.py`` the way Triton's Python backend does.

The version directory is importable as a package (``<version>.model``), so ``model.py`` can do
``import sibling`` and ``from . import sibling``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from shoal.stub import backends, c_python_backend_utils, pb_utils


def install_pb_utils() -> None:
    """Make ``import triton_python_backend_utils`` (and the native module behind it in Triton,
    ``c_python_backend_utils``) find shoal's compatibility modules."""
    sys.modules["triton_python_backend_utils"] = pb_utils
    sys.modules["c_python_backend_utils"] = c_python_backend_utils


def import_model_module(model_file: str) -> ModuleType:
    """Import ``model_file`` (``<model dir>/<version>/model.py``) as ``<version>.<stem>``."""
    _check_exists(model_file)
    version_dir = os.path.dirname(os.path.abspath(model_file))
    _extend_path(version_dir)
    stem = os.path.splitext(os.path.basename(model_file))[0]
    package = os.path.basename(version_dir)
    return importlib.import_module(f"{package}.{stem}")


def _check_exists(model_file: str) -> None:
    if not os.path.isfile(model_file):
        version_dir = os.path.dirname(model_file)
        raise FileNotFoundError(
            f"Failed to preinitialize Python stub: Python model file not found in '{version_dir}'"
        )


def _extend_path(version_dir: str) -> None:
    """The version and model directories go on the path: the model imports its neighbours."""
    for path in (version_dir, os.path.dirname(version_dir)):
        if path not in sys.path:
            sys.path.append(path)


def import_backend_module(runtime_file: str) -> ModuleType:
    """Import a Python-based backend's ``model.py`` as Triton does: as the top-level module
    ``model``, with the backend's directory on ``sys.path`` (for its sibling modules)."""
    if not os.path.isfile(runtime_file):
        raise FileNotFoundError(f"Python-based backend file not found: '{runtime_file}'")
    backend_dir = os.path.dirname(os.path.abspath(runtime_file))
    if backend_dir not in sys.path:
        sys.path.append(backend_dir)
    return importlib.import_module(os.path.splitext(os.path.basename(runtime_file))[0])


def import_model(model_file: str, runtime_file: str = "") -> ModuleType:
    """The module of a model: its backend's ``model.py`` if it has a Python-based backend,
    else its own ``model.py``."""
    if runtime_file:
        return import_backend_module(runtime_file)
    return import_model_module(model_file)


def model_class(module: ModuleType, model_file: str) -> Any:
    """The module's ``TritonPythonModel``."""
    found = getattr(module, "TritonPythonModel", None)
    if found is None:
        raise AttributeError(f"Python model '{model_file}' does not define 'TritonPythonModel'")
    return found


def instantiate(module: ModuleType, model_file: str) -> Any:
    """Create the module's ``TritonPythonModel`` and check it can execute."""
    model = model_class(module, model_file)()
    if not callable(getattr(model, "execute", None)):
        raise AttributeError(f"Python model {model_file} does not implement `execute` method.")
    return model


def create_model(model_file: str, args: Mapping[str, str], runtime_file: str = "") -> Any:
    """The model object of an instance: the built-in model class of the configuration's backend
    (``onnxruntime``, ``pytorch``), or else the ``TritonPythonModel`` of ``model.py`` (the
    backend's, for a Python-based backend)."""
    backend = backends.builtin_backend(args)
    if backend is not None:
        return backends.create_model(backend, model_file)
    return instantiate(import_model(model_file, runtime_file), runtime_file or model_file)
