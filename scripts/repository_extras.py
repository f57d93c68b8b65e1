"""Print the pip extras of shoal (``onnx``, ``torch``) that the models of a repository need.

``make serve`` installs shoal's runtime dependencies only, then the extras this script names:
a repository of Python models needs none. It reads each model's ``config.pbtxt`` for its
backend or platform, and looks for ``model.onnx`` / ``model.pt`` files where there is none.
Usage: ``python scripts/repository_extras.py REPOSITORY...`` (prints e.g. ``onnx,torch``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: backend or platform name -> the extra that brings its framework.
EXTRAS = {
    "onnxruntime": "onnx",
    "onnxruntime_onnx": "onnx",
    "pytorch": "torch",
    "pytorch_libtorch": "torch",
}
MODEL_FILES = {".onnx": "onnx", ".pt": "torch"}
_SETTING = re.compile(r'^\s*(backend|platform)\s*:\s*"([^"]*)"', re.M)


def model_extras(model_dir: Path) -> set[str]:
    """The extras one model directory needs, from its configuration or else from its files."""
    config = model_dir / "config.pbtxt"
    settings = _SETTING.findall(config.read_text()) if config.is_file() else []
    if settings:
        return {EXTRAS[value] for _, value in settings if value in EXTRAS}
    # No backend given: shoal completes the configuration from the model file's suffix.
    return {MODEL_FILES[p.suffix] for p in model_dir.glob("*/model.*") if p.suffix in MODEL_FILES}


def repository_extras(repositories: list[Path]) -> list[str]:
    extras: set[str] = set()
    for repository in repositories:
        if not repository.is_dir():  # a remote repository (s3://...): shoal says what it lacks
            continue
        for model_dir in sorted(p for p in repository.iterdir() if p.is_dir()):
            extras |= model_extras(model_dir)
    return sorted(extras)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    print(",".join(repository_extras([Path(a) for a in argv])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
