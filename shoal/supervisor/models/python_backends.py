"""Python-based backends: ``backend: "<name>"`` runs ``<backend-directory>/<name>/model.py``.

This is how Triton ships backends written in Python (vLLM's, for one): the backend's directory
holds a ``model.py`` shared by every model that names the backend, and each model's repository
directory holds only its configuration and whatever files that ``model.py`` reads (vLLM's
``1/model.json``). Triton looks for a backend's directory for every name that is not one of its
own; shoal does the same for every name it does not run itself.
"""

from __future__ import annotations

import os
from pathlib import Path

from shoal import config as model_config
from shoal.protos import model_config_pb2 as pb

#: Backends shoal runs itself: the Python backend (a model's own ``model.py``) and the ones
#: under ``shoal.stub.backends``.
BUILT_IN = frozenset({"python", "onnxruntime", "pytorch"})
#: Triton's default ``--backend-directory``.
DEFAULT_DIRECTORY = "/opt/tritonserver/backends"
RUNTIME_FILE = "model.py"


def runtime_file(proto: pb.ModelConfig, backend_directory: str) -> Path | None:
    """The ``model.py`` of the model's Python-based backend; None for a built-in backend or an
    ensemble. Raises ConfigError when the backend's directory holds no ``model.py``."""
    backend = proto.backend
    if not backend or proto.platform == "ensemble":
        return None
    directory = Path(backend_directory) / backend
    if proto.runtime:
        _check_escape(proto, directory)
    if backend in BUILT_IN:
        return None
    if proto.runtime and proto.runtime != RUNTIME_FILE:
        return _named_runtime(proto, directory)
    candidate = directory / RUNTIME_FILE
    if candidate.is_file():
        return candidate.resolve()
    if (directory / f"libtriton_{backend}.so").is_file():
        why = (
            f"{directory} holds libtriton_{backend}.so, a C++ backend, which shoal cannot run; "
            "shoal runs Python-based backends (a model.py in the backend's directory)"
        )
    else:
        why = f"{candidate} does not exist (--backend-directory is '{backend_directory}')"
    raise model_config.ConfigError(
        f"unable to find backend library for backend '{backend}', try specifying runtime on "
        f"the model configuration: {why}",
        field_path=("backend",),
    )


def _check_escape(proto: pb.ModelConfig, directory: Path) -> None:
    """Triton's check that ``runtime`` names a file inside the backend's directory (shoal's
    refuses the name whether or not such a file exists)."""
    inside = os.path.normpath(directory)
    if os.path.commonpath([inside, os.path.normpath(directory / proto.runtime)]) != inside:
        raise model_config.ConfigError(
            f"backend library name '{proto.runtime}' escapes backend directory '{directory}', "
            f"for model '{proto.name}', check model config runtime field: name a file inside "
            "the backend's directory",
            field_path=("runtime",),
        )


def _named_runtime(proto: pb.ModelConfig, directory: Path) -> Path:
    """The file ``runtime`` names in the backend's directory: a Python file shoal runs as the
    backend's ``model.py``; anything else is a C++ library shoal cannot run."""
    candidate = directory / proto.runtime
    if proto.runtime.endswith(".py") and candidate.is_file():
        return candidate.resolve()
    if candidate.is_file():
        why = f"{candidate} is a C++ backend library, which shoal cannot run"
    else:
        why = f"{candidate} does not exist"
    raise model_config.ConfigError(
        f"unable to find backend library '{proto.runtime}' for model '{proto.name}', searched: "
        f"'{directory}': {why}; shoal runs Python-based backends (a .py file in the backend's "
        "directory)",
        field_path=("runtime",),
    )
