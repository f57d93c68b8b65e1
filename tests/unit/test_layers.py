"""The dependency rules of DESIGN.md §2, checked on the source of every module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "shoal"

# package -> shoal packages it may import
ALLOWED = {
    "ipc": {"ipc"},
    "stub": {"ipc", "stub"},
    "config": {"config", "protos"},
    "protos": {"protos"},
    "supervisor": {"supervisor", "ipc", "config", "protos"},
    "frontends": {
        "frontends",
        "protos",
        "supervisor.core",
        "supervisor.errors",
        "supervisor.types",
        "ipc.dtypes",
    },
}


def _shoal_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("shoal."))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "shoal":
                found.update(f"shoal.{a.name}" for a in node.names)
            elif node.module.startswith("shoal."):
                found.add(node.module)
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_follow_the_layers(package):
    allowed = ALLOWED[package]
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in _shoal_imports(path):
            target = name.removeprefix("shoal.")
            ok = any(target == a or target.startswith(a + ".") for a in allowed)
            # shoal.types-only re-exports used for typing are still imports: no exceptions.
            assert ok or target in ("__version__",), f"{path.relative_to(ROOT)} imports {name}"
