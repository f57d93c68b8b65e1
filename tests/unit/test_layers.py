"""The dependency rules of DESIGN.md §2, checked on the source of every module of shoal/.

Every import counts: module level, inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "shoal"

pytestmark = pytest.mark.timeout(30)

# package (or top-level module) -> the shoal packages it may import
ALLOWED: dict[str, set[str]] = {
    "ipc": {"ipc"},
    "stub": {"ipc", "stub"},
    "protos": {"protos"},
    "config": {"config", "protos"},
    "core": {"core", "ipc"},
    "supervisor": {"supervisor", "core", "ipc", "config", "protos"},
    "frontends": {"frontends", "core", "protos"},
    "perf": {"perf", "protos"},  # a client: nothing of the server's processes
    # the composition root and the command line may wire anything but the stub
    "server": {"server", "_compiled", "_endpoints", "core", "frontends", "ipc", "supervisor"},
    "_endpoints": {"core", "frontends", "supervisor"},
    "cli": {
        "cli",
        "_early_log",
        "_serve_flags",
        "_serve_parser",
        "_triton_flags",
        "server",
        "config",
        "perf",
        "supervisor",
    },
    # the command line's parser: flag tables and their argparse types
    "_serve_parser": {
        "_serve_flags",
        "_flag_types",
        "_network_flags",
        "_triton_flags",
        "perf",
        "supervisor",
    },
    "_triton_flags": {"_flag_types", "frontends"},
    "_network_flags": {"_flag_types", "frontends", "supervisor"},
    "_flag_types": {"frontends", "supervisor"},
    "_serve_flags": set(),
    "__init__": {"_compiled"},
    "_compiled": set(),
    "check_compiled": {"_compiled"},
    # the entry point: the log file opened before the command line's imports
    "_launch": {"_early_log", "cli"},
    "_early_log": set(),
    "__main__": {"_launch"},
}

# folders that are stricter than their package (entries are dotted prefixes)
NARROWER: dict[str, set[str]] = {
    "frontends/h2": {"frontends.h2"},
}

# the only folder of frontends that may import ipc (arenas, fd passing to the core)
WORKERS = "frontends/workers/"

# third-party modules frontends/h2 may import: it stays a plain HTTP/2 codec
H2_THIRD_PARTY = {"hpack"}


def _unit(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _package(path: Path) -> list[str]:
    parts = ["shoal", *path.relative_to(ROOT).with_suffix("").parts]
    return parts[:-1]


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports, relative imports made absolute."""
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                anchor = _package(path)[: len(_package(path)) - node.level + 1]
                module = ".".join(anchor + ([module] if module else []))
            if module == "shoal":
                found.update(f"shoal.{a.name}" for a in node.names)
            else:
                found.add(module)
    return found


def _shoal_targets(path: Path) -> set[str]:
    return {n.removeprefix("shoal.") for n in _imports(path) if n.startswith("shoal.")}


def _allowed(path: Path) -> set[str]:
    rel = path.relative_to(ROOT).as_posix()
    for folder, allowed in NARROWER.items():
        if rel.startswith(folder + "/"):
            return allowed
    allowed = set(ALLOWED[_unit(path)])
    if rel.startswith(WORKERS):
        allowed.add("ipc")
    return allowed


def _sources() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_package_has_a_rule():
    missing = {_unit(p) for p in _sources()} - set(ALLOWED)
    assert not missing, f"no dependency rule for {sorted(missing)}"


@pytest.mark.parametrize("unit", sorted(ALLOWED))
def test_package_imports_follow_the_layers(unit):
    for path in _sources():
        if _unit(path) != unit:
            continue
        allowed = _allowed(path)
        for target in sorted(_shoal_targets(path)):
            ok = any(target == a or target.startswith(a + ".") for a in allowed)
            assert ok or target == "__version__", f"{path.relative_to(ROOT)} imports shoal.{target}"


def test_h2_imports_only_hpack_besides_the_standard_library():
    for path in sorted((ROOT / "frontends" / "h2").glob("*.py")):
        outside = {
            name.split(".")[0]
            for name in _imports(path)
            if name.split(".")[0] not in sys.stdlib_module_names and not name.startswith("shoal.")
        }
        assert outside <= H2_THIRD_PARTY, f"{path.relative_to(ROOT)} imports {sorted(outside)}"


def test_no_import_cycles():
    spec = importlib.util.spec_from_file_location("code_shape", REPO / "scripts" / "code_shape.py")
    assert spec is not None and spec.loader is not None
    code_shape = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code_shape)
    assert code_shape.import_cycles(ROOT) == []
