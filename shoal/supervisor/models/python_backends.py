"""Python-based backends: ``backend: "<name>"`` runs ``<backend-directory>/<name>/model.py``.

This is how Triton ships backends written in Python (vLLM's, for one): the backend's directory
holds a ``model.py`` shared by every model that names the backend, and each model's repository
directory holds only its configuration and whatever files that ``model.py`` reads (vLLM's
``1/model.json``). Triton looks for a backend's directory for every name that is not one of its
own; shoal does the same for every name it does not run itself.
"""

from __future__ import annotations

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
    if not backend or backend in BUILT_IN or proto.platform == "ensemble":
        return None
    directory = Path(backend_directory) / backend
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
