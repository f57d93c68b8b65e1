"""The compiled hot path: all of it or none of it runs compiled, and never an extension older
than its source (shoal/_compiled.py)."""

from __future__ import annotations

import ast
import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shoal import _compiled

pytestmark = pytest.mark.timeout(60)

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
PATHS = ("shoal/a.py", "shoal/sub/b.py")


def _tree(root: Path, built: tuple[str, ...], recorded: bool = True) -> None:
    for path in PATHS:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(f"# {path}\n")
    if recorded:
        _compiled.record_sources(str(root), PATHS)
    for path in built:
        (root / (path.removesuffix(".py") + SUFFIX)).write_bytes(b"")


def test_nothing_built_is_interpreted(tmp_path: Path) -> None:
    _tree(tmp_path, built=(), recorded=False)
    assert _compiled._built_state(str(tmp_path), PATHS) == "interpreted"


def test_a_build_of_the_sources_there_is_compiled(tmp_path: Path) -> None:
    _tree(tmp_path, built=PATHS)
    assert _compiled._built_state(str(tmp_path), PATHS) == "compiled"


def test_a_source_edited_after_the_build_makes_it_stale(tmp_path: Path) -> None:
    _tree(tmp_path, built=PATHS)
    (tmp_path / PATHS[1]).write_text("# edited\n")
    assert _compiled._built_state(str(tmp_path), PATHS) == "stale"


def test_half_a_build_or_no_record_is_stale(tmp_path: Path) -> None:
    _tree(tmp_path, built=PATHS[:1])
    assert _compiled._built_state(str(tmp_path), PATHS) == "stale"
    _tree(tmp_path, built=PATHS, recorded=False)
    (tmp_path / "shoal" / _compiled.RECORD).unlink()
    assert _compiled._built_state(str(tmp_path), PATHS) == "stale"


def _imported_files(env: dict[str, str]) -> dict[str, object]:
    names = [p.removesuffix(".py").replace("/", ".") for p in _compiled.HOT_PATH]
    script = (
        "import importlib, json, shoal._compiled as c\n"
        f"files = {{n: importlib.import_module(n).__file__ for n in {names!r}}}\n"
        "print(json.dumps({'state': c.state, 'files': files}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=50,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_the_hot_path_is_all_compiled_or_all_source() -> None:
    result = _imported_files({})
    files = result["files"]
    assert isinstance(files, dict)
    compiled = [f.endswith(SUFFIX) for f in files.values()]
    assert all(compiled) if result["state"] == "compiled" else not any(compiled)


def test_shoal_pure_python_imports_the_sources() -> None:
    result = _imported_files({"SHOAL_PURE_PYTHON": "1"})
    files = result["files"]
    assert isinstance(files, dict)
    assert result["state"] == "interpreted"
    assert all(f.endswith(".py") for f in files.values())


@pytest.mark.skipif(
    not os.environ.get("SHOAL_REQUIRE_COMPILED"),
    reason="set SHOAL_REQUIRE_COMPILED=1 where a compiler is present (.ci/run does)",
)
def test_the_build_compiled_the_hot_path() -> None:
    # A build that fails leaves shoal interpreted without failing `make` (by design, for users
    # without a compiler); this is what stops such a failure from passing CI unseen.
    assert _compiled.state == "compiled", (
        f"the request hot path is {_compiled.state}: run `make .venv/.shoal-compiled` without "
        "--quiet (or `python setup.py build_ext --inplace`) to see why mypyc or the C build failed"
    )


def _awaits_in_finally(source: str) -> list[str]:
    """``function:line`` of every await (or async for/with) inside a ``finally`` of a coroutine."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if not isinstance(node, ast.Try):
                continue
            for statement in node.finalbody:
                for inner in ast.walk(statement):
                    if isinstance(inner, ast.Await | ast.AsyncFor | ast.AsyncWith):
                        found.append(f"{function.name}:{inner.lineno}")
    return found


def test_no_compiled_coroutine_awaits_in_a_finally() -> None:
    """mypyc miscompiles it: after the await, the finally re-raises the last exception handled
    before it, even when the try ended normally (a frontend worker's every stream after a
    failed one ended with that failure). Close or clean up after the try instead."""
    root = Path(_compiled.__file__).resolve().parent.parent
    found = {
        path: where
        for path in _compiled.HOT_PATH
        if (where := _awaits_in_finally((root / path).read_text()))
    }
    assert not found, found


def test_the_finally_check_finds_an_await_in_a_finally() -> None:
    source = "async def f(s):\n    try:\n        pass\n    finally:\n        await s.aclose()\n"
    assert _awaits_in_finally(source) == ["f:5"]


def _union_members(annotation: ast.expr) -> list[ast.expr]:
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _union_members(annotation.left) + _union_members(annotation.right)
    return [annotation]


def _union_aliases(trees: list[ast.Module]) -> set[str]:
    """Module-level names bound to a union (``Chunk = bytes | memoryview``)."""
    names = set()
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _wide_none_defaults(trees: dict[str, ast.Module]) -> list[str]:
    """``path:Class.attribute`` of each class-body ``x: A | B | None = None``."""
    aliases = _union_aliases(list(trees.values()))
    found = []
    for path, tree in trees.items():
        for cls in ast.walk(tree):
            if not isinstance(cls, ast.ClassDef):
                continue
            for statement in cls.body:
                if not (
                    isinstance(statement, ast.AnnAssign)
                    and isinstance(statement.target, ast.Name)
                    and isinstance(statement.value, ast.Constant)
                    and statement.value.value is None
                ):
                    continue
                members = _union_members(statement.annotation)
                if len(members) > 2 or any(
                    isinstance(m, ast.Name) and m.id in aliases for m in members
                ):
                    found.append(f"{path}:{cls.name}.{statement.target.id}")
    return found


def test_no_compiled_class_defaults_none_for_a_wide_union() -> None:
    """mypyc (2.4.1) drops a class-body default of None whose type is a union of more than one
    type and None: compiled, the attribute is undefined until assigned (AttributeError).
    Assign such attributes in ``__init__``."""
    root = Path(_compiled.__file__).resolve().parent.parent
    trees = {path: ast.parse((root / path).read_text()) for path in _compiled.HOT_PATH}
    assert not _wide_none_defaults(trees), _wide_none_defaults(trees)


def test_the_default_check_finds_a_wide_union_default() -> None:
    source = (
        "Chunk = bytes | memoryview\n"
        "class A:\n    a: bytes | None = None\n    b: bytes | str | None = None\n"
        "    c: Chunk | None = None\n"
    )
    assert _wide_none_defaults({"m.py": ast.parse(source)}) == ["m.py:A.b", "m.py:A.c"]
