"""Model files uploaded with a load request (``file:<path>`` parameters), written to a private
directory the model then loads from, with Triton's checks on names and paths."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from shoal.core.errors import InvalidArgument

#: The longest file name and path Linux takes (NAME_MAX, PATH_MAX less the scratch directory).
_NAME_MAX = 255
_PATH_MAX = 3072


def write_model_files(name: str, files: dict[str, bytes]) -> tuple[str, str]:
    """Materialise uploaded ``file:<path>`` contents in a new private directory named ``name``;
    returns the scratch root (the caller removes it) and the model directory inside it."""
    _check_model_dir_name(name)
    relatives = {key: _file_path(name, key) for key in files}
    root = tempfile.mkdtemp(prefix="shoal-model-")
    model_dir = Path(root) / name
    try:
        _write_files(name, model_dir, files, relatives)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root, str(model_dir)


def _write_files(
    name: str, model_dir: Path, files: dict[str, bytes], relatives: dict[str, str]
) -> None:
    model_dir.mkdir()
    for key, content in files.items():
        _write_file(name, model_dir, key, relatives[key], content)


def _check_model_dir_name(name: str) -> None:
    if name in ("", ".", "..") or "/" in name or _bad_file_name(name):
        # The name becomes a directory: "." or ".." would be the scratch directory itself
        # or its parent.
        raise InvalidArgument(
            f"failed to load '{name}': a model loaded from files needs a name that can be a "
            f"directory name (not '.', '..', nor containing '/' or NUL, at most {_NAME_MAX} "
            "bytes)"
        )


def _write_file(name: str, model_dir: Path, key: str, relative: str, content: bytes) -> None:
    target = (model_dir / relative).resolve()
    if not target.is_relative_to(model_dir.resolve()) or target == model_dir:
        raise InvalidArgument(
            f"failed to load '{name}': file parameter '{key}' must be "
            "'file:<relative path>' inside the model directory"
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as error:
        # "file:1" beside "file:1/model.py": one path is a file and a directory.
        raise InvalidArgument(
            f"failed to load '{name}': file parameter '{key}' cannot be written: "
            f"{error.strerror} (another file parameter uses the same path as a "
            "file and as a directory)"
        ) from None


def _bad_file_name(name: str) -> bool:
    """A name no file can have: NUL, not encodable, or longer than NAME_MAX bytes."""
    try:
        encoded = os.fsencode(name)
    except UnicodeEncodeError:
        return True
    return b"\0" in encoded or len(encoded) > _NAME_MAX


def _file_path(model: str, key: str) -> str:
    """The relative path a ``file:<path>`` load parameter names (INVALID_ARGUMENT unless it is
    a file's path: not a directory, no NUL, no part over NAME_MAX, not over PATH_MAX)."""
    if not key.startswith("file:"):
        raise InvalidArgument(
            f"failed to load '{model}': file parameter '{key}' must be 'file:<relative path>'"
        )
    relative = key.removeprefix("file:").lstrip("/")  # "file:/1/model.py" too
    problem = _path_problem(relative)
    if problem is None:
        return relative
    shown = key if len(key) <= 80 else key[:77] + "..."
    raise InvalidArgument(f"failed to load '{model}': file parameter {shown!r} {problem}")


def _path_problem(relative: str) -> str | None:
    parts = relative.split("/")
    if parts[-1] in ("", ".", ".."):
        return "names a directory, not a file"
    if any(_bad_file_name(part) for part in parts):
        return f"has a NUL, a name that is not valid, or a name over {_NAME_MAX} bytes"
    if len(os.fsencode(relative)) > _PATH_MAX:
        return f"is a path over {_PATH_MAX} bytes"
    return None
