"""Regenerate the Python modules of every ``shoal/protos/*.proto`` (or check they are current).

Usage (from anywhere)::

    python scripts/gen_protos.py          # write shoal/protos/*_pb2.py, *_pb2.pyi, *_pb2_grpc.py
    python scripts/gen_protos.py --check  # exit 1 if committed files differ from a fresh build

Protos are compiled with the repository root as the only import path, so a proto imports another
as ``import "shoal/protos/model_config.proto";`` and the generated code reads
``from shoal.protos import model_config_pb2``. A ``*_pb2_grpc.py`` module is generated only for
protos that declare a ``service``. The output depends on the grpcio-tools version (its protoc
stamps its version into every file), so pin grpcio-tools where ``--check`` runs in CI.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = Path("shoal") / "protos"
_SERVICE = re.compile(r"^\s*service\s+\w+", re.MULTILINE)
_GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files(root: Path = ROOT) -> list[Path]:
    """The ``.proto`` files to compile, relative to ``root``, in a stable order."""
    return sorted(p.relative_to(root) for p in (root / PROTO_DIR).glob("*.proto"))


def _protoc(root: Path, args: Sequence[str]) -> None:
    from grpc_tools import protoc  # imported here: only this script needs grpcio-tools

    include = Path(protoc.__file__).resolve().parent / "_proto"
    code = protoc.main(["grpc_tools.protoc", f"-I{root}", f"-I{include}", *args])
    if code != 0:
        raise SystemExit(f"protoc failed (exit {code}) for: {' '.join(args)}")


def generate(out_dir: Path, root: Path = ROOT) -> list[Path]:
    """Compile every proto under ``root`` into ``out_dir``; return the written paths (relative)."""
    written: list[Path] = []
    for proto in proto_files(root):
        args = [f"--python_out={out_dir}", f"--pyi_out={out_dir}"]
        if _SERVICE.search((root / proto).read_text(encoding="utf-8")):
            args.append(f"--grpc_python_out={out_dir}")
        _protoc(root, [*args, str(root / proto)])
    for path in sorted((out_dir / PROTO_DIR).glob("*")):
        if path.name.endswith(_GENERATED_SUFFIXES):
            written.append(path.relative_to(out_dir))
    return written


def _committed(root: Path) -> set[Path]:
    return {
        p.relative_to(root)
        for p in (root / PROTO_DIR).glob("*")
        if p.name.endswith(_GENERATED_SUFFIXES)
    }


def check(root: Path = ROOT) -> list[str]:
    """Differences between the committed generated files and a fresh build (empty: up to date)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh_dir = Path(tmp)
        fresh = set(generate(fresh_dir, root))
        problems: list[str] = []
        for rel in sorted(fresh | _committed(root)):
            if rel not in fresh:
                problems.append(f"{rel}: generated file has no .proto any more (delete it)")
            elif not (root / rel).exists():
                problems.append(f"{rel}: missing (run scripts/gen_protos.py)")
            elif (root / rel).read_bytes() != (fresh_dir / rel).read_bytes():
                problems.append(f"{rel}: out of date (run scripts/gen_protos.py)")
        return problems


def write(root: Path = ROOT) -> list[Path]:
    """Regenerate in place, removing generated files whose proto is gone."""
    stale = _committed(root)
    written = generate(root, root)
    for rel in stale - set(written):
        (root / rel).unlink()
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="verify the committed generated files, write nothing"
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    for rel in write():
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
