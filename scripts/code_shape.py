"""The shape of shoal's code in figures: module sizes, function sizes and import cycles.

    python scripts/code_shape.py [ROOT]        (ROOT: the package folder, default ./shoal)

* Module size: lines in the file (``wc -l``). Generated protobuf modules are left out.
* Function size: non-blank lines from ``def`` to the end of the body (a nested function counts
  in its parent and on its own); median and 90th percentile over every function and method.
* Import cycles: strongly connected components of the graph "module A imports module B", with
  every import in the file (module level, inside functions and under ``TYPE_CHECKING``).
  ``from package import name`` is an edge to ``package.name`` when that is a module, and to the
  package's ``__init__`` otherwise.
"""

from __future__ import annotations

import ast
import statistics
import sys
from pathlib import Path

LIMIT = 450


def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        if path.name.endswith("_pb2.py") or path.name.endswith("_pb2_grpc.py"):
            continue
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _function_sizes(tree: ast.AST, lines: list[str]) -> list[int]:
    sizes = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            body = lines[start - 1 : node.end_lineno]
            sizes.append(sum(1 for line in body if line.strip()))
    return sizes


def _imports(tree: ast.AST, name: str, modules: dict[str, Path]) -> set[str]:
    targets: set[str] = set()
    package = name if modules[name].name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                child = f"{base}.{alias.name}"
                targets.add(child if child in modules else base)
    return {t for t in targets if t in modules and t != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def import_cycles(root: Path) -> list[list[str]]:
    """Every import cycle among the modules under ``root`` (used by tests/unit/test_layers.py)."""
    modules = _modules(root)
    graph = {}
    for name, path in modules.items():
        graph[name] = _imports(ast.parse(path.read_text(), str(path)), name, modules)
    return _cycles(graph)


def _percentile(values: list[int], share: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(share * len(ordered)))])


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "shoal").resolve()
    modules = _modules(root)
    sizes: list[int] = []
    lengths = {}
    for path in modules.values():
        text = path.read_text()
        lengths[path.relative_to(root.parent)] = len(text.splitlines())
        sizes.extend(_function_sizes(ast.parse(text, str(path)), text.splitlines()))
    big = sorted(((n, p) for p, n in lengths.items() if n > LIMIT), reverse=True)
    cycles = import_cycles(root)
    print(f"modules: {len(lengths)}, lines: {sum(lengths.values())}")
    print(
        "largest: "
        + ", ".join(
            f"{p} {n}" for n, p in sorted(((n, p) for p, n in lengths.items()), reverse=True)[:5]
        )
    )
    print(f"modules over {LIMIT} lines: {len(big)}" + "".join(f"\n  {p} {n}" for n, p in big))
    print(
        f"functions: {len(sizes)}, non-blank lines median {statistics.median(sizes):g},"
        f" p90 {_percentile(sizes, 0.9):g}, max {max(sizes)}"
    )
    print(f"import cycles: {len(cycles)}" + "".join(f"\n  {' <-> '.join(c)}" for c in cycles))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
