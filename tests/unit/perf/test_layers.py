"""shoal.perf is a client: it imports nothing of the server's processes."""

import ast
from pathlib import Path

import pytest

PERF = Path(__file__).resolve().parents[3] / "shoal" / "perf"
FORBIDDEN = ("shoal.supervisor", "shoal.stub", "shoal.ipc", "shoal.frontends", "shoal.server")

pytestmark = pytest.mark.timeout(10)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("path", sorted(PERF.glob("*.py")), ids=lambda p: p.name)
def test_perf_is_only_a_client(path):
    bad = {n for n in _imports(path) if n.startswith(FORBIDDEN)}
    assert not bad, f"{path.name} imports {bad}"
