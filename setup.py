"""Compiles shoal's request hot path with mypyc where it can; setup.cfg holds the metadata.

mypyc type-checks what it compiles, so it needs shoal's dependencies importable: the Makefile
installs them first and then builds without isolation (`pip install --no-build-isolation -e .`).
Where mypyc, the dependencies or a C compiler are missing, or SHOAL_PURE_PYTHON=1 is set, shoal
installs interpreted and behaves the same, only slower (docs/perf.md, "Compiled hot path"); with
SHOAL_REQUIRE_COMPILED=1 (the container image's build, CI) such a build fails instead.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _say(message: str) -> None:
    print(f"shoal: {message}", file=sys.stderr)


def _required() -> bool:
    return bool(os.environ.get("SHOAL_REQUIRE_COMPILED")) and not os.environ.get(
        "SHOAL_PURE_PYTHON"
    )


def _cannot_compile(message: str) -> None:
    """Stay interpreted, or fail the build where the compiled hot path is required."""
    if _required():
        raise SystemExit(f"shoal: {message}, and SHOAL_REQUIRE_COMPILED=1 is set: build failed")
    _say(f"{message}; the hot path stays interpreted")


HERE = os.path.dirname(os.path.abspath(__file__))


def _compiled_module() -> Any:
    # Loaded by path: importing the shoal package would run its import guard.
    spec = importlib.util.spec_from_file_location("_shoal_compiled", f"{HERE}/shoal/_compiled.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _extensions() -> list[Extension]:
    if os.environ.get("SHOAL_PURE_PYTHON"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _cannot_compile("mypyc is not installed (pip install 'shoal[compile]')")
        return []
    compiled = _compiled_module()
    try:
        # An ignore that another version of numpy or protobuf makes unneeded must not stop the
        # build: `make check` holds the code to --warn-unused-ignores, against pinned versions.
        # Nor must a bare `np.ndarray`: numpy < 2.3 (the last for Python 3.10) gives its type
        # parameters no defaults, so strict mode calls it a missing type argument there.
        options = ["--no-warn-unused-ignores", "--disable-error-code=type-arg"]
        paths = [*options, *compiled.HOT_PATH]
        extensions = list(mypycify(paths, opt_level="3", group_name="shoal._hot"))
    except (Exception, SystemExit) as e:  # mypyc exits on a type error it cannot compile
        _cannot_compile(f"mypyc could not compile the hot path ({e!r})")
        return []
    compiled.record_sources(HERE, compiled.HOT_PATH)
    return extensions


class _OptionalBuildExt(build_ext):  # type: ignore[misc]
    """A failed C build leaves shoal interpreted instead of failing the install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:
            _cannot_compile(f"compiling the hot path failed ({e!r})")


setup(ext_modules=_extensions(), cmdclass={"build_ext": _OptionalBuildExt})
