"""The Containerfile's essentials, read from the file (CI has no container engine), and the
dependency that building it found missing: a plain ``pip install shoal`` must bring every module
that shoal imports at module level."""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.manifests import KUSTOMIZATIONS, REPO_ROOT, containers, one, render

CONTAINERFILE = REPO_ROOT / "Containerfile"
# .dockerignore, not .containerignore: podman and buildah read it too, docker reads only it.
IGNORE_FILE = REPO_ROOT / ".dockerignore"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def _all(name: str) -> list[str]:
    return [rest for word, rest in _instructions() if word == name]


def _final_stage() -> list[tuple[str, str]]:
    steps = _instructions()
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def test_base_image_is_a_slim_python_chosen_by_build_argument():
    args = dict(a.partition("=")[::2] for a in _all("ARG") if "=" in a)
    assert re.search(r"python:3\.1\d+-slim", args["BASE_IMAGE"]), args["BASE_IMAGE"]
    assert all(rest.startswith("${BASE_IMAGE}") for rest in _all("FROM"))
    assert any(rest.startswith("EXTRAS") for rest in _all("ARG"))
    install = " ".join(rest for rest in _all("RUN") if "pip install" in rest)
    assert "${EXTRAS:+,$EXTRAS}]" in install, "EXTRAS must select shoal's extras"


def test_final_stage_runs_shoal_serve_as_a_non_root_user():
    final = _final_stage()
    users = [rest for word, rest in final if word == "USER"]
    assert users and users[-1].split(":")[0] == "10001", f"USER {users}"
    pod = one(render(KUSTOMIZATIONS["cpu"]), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(users[-1].split(":")[0])
    entrypoint = json.loads(next(rest for word, rest in final if word == "ENTRYPOINT"))
    assert entrypoint[-2:] == ["shoal", "serve"], entrypoint
    assert entrypoint[0].endswith("tini"), "PID 1 must reap the models' orphans"
    cmd = json.loads(next(rest for word, rest in final if word == "CMD"))
    assert cmd == ["--model-repository", "/models"]


def test_exposed_ports_are_the_manifests_ports():
    exposed = {int(p) for rest in _all("EXPOSE") for p in shlex.split(rest)}
    deployment = one(render(KUSTOMIZATIONS["cpu"]), "Deployment")
    ports = {p["containerPort"] for p in containers(deployment)[0]["ports"]}
    assert exposed == ports == {8000, 8001, 8002}


def test_bundled_models_land_where_the_manifests_look():
    copies = [rest for word, rest in _final_stage() if word == "COPY"]
    assert any(rest.endswith(" /models/") for rest in copies), copies
    assert (REPO_ROOT / "model_repository").is_dir()


def test_build_context_keeps_what_the_build_copies():
    lines = [ln.strip() for ln in IGNORE_FILE.read_text().splitlines()]
    kept = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    assert "*" in lines, "the ignore file should allow-list the build context"
    for needed in ("pyproject.toml", "setup.cfg", "README.md", "shoal", "model_repository"):
        assert needed in kept, f"{needed} is not in the build context"


def _requirements() -> dict[str, set[str]]:
    """Canonical distribution names of install_requires and of each extra (but test)."""
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")

    def names(block: str) -> set[str]:
        lines = [line for line in block.split("\n") if line.strip()]
        return {canonicalize_name(Requirement(line).name) for line in lines}

    found = {"install_requires": names(config["options"]["install_requires"])}
    for extra, block in config["options.extras_require"].items():
        if extra != "test":
            found[f"extra {extra}"] = names(block)
    return found


def _module_level_imports() -> dict[str, str]:
    """Top-level package -> a file importing it unconditionally at module level."""
    found: dict[str, str] = {}
    for path in sorted((REPO_ROOT / "shoal").rglob("*.py")):
        if "protos" in path.parts:
            continue  # generated code; its imports (protobuf) are checked through its users
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(REPO_ROOT)))
    return found


def _packages_distributions() -> dict[str, list[str]]:
    """Top-level package -> distributions, as Python 3.11+ computes it: 3.10's
    packages_distributions reads only top_level.txt, which protobuf's wheels lack ("google")."""
    providers = {k: list(v) for k, v in importlib.metadata.packages_distributions().items()}
    if sys.version_info < (3, 11):
        for dist in importlib.metadata.distributions():
            if dist.read_text("top_level.txt") is None:
                for file in dist.files or ():
                    if file.suffix == ".py":
                        top = file.parts[0] if len(file.parts) > 1 else file.stem
                        providers.setdefault(top, []).append(dist.metadata["Name"])
    return providers


def test_install_requires_covers_every_module_level_import():
    """A module that imports an extra's package at module level is fine only if that extra names
    it (the module is then imported only when the extra's feature is used)."""
    provided = set().union(*_requirements().values())
    providers = _packages_distributions()
    missing = []
    for module, where in _module_level_imports().items():
        if module in sys.stdlib_module_names or module in ("shoal", "__future__"):
            continue
        # A package not installed here is looked up by its own name.
        dists = {canonicalize_name(d) for d in providers.get(module, [module])}
        if not dists & provided:
            missing.append(f"{module} (imported by {where}, from {sorted(dists)})")
    assert not missing, f"setup.cfg install_requires lacks: {missing}"


def _build_stage_install() -> str:
    return next(rest for rest in _all("RUN") if "--no-build-isolation" in rest)


def test_the_image_build_fails_when_the_hot_path_does_not_compile():
    install = _build_stage_install()
    assert "[compile" in install, "the build stage must install the `compile` extra"
    assert "SHOAL_REQUIRE_COMPILED=" in install, "a mypyc failure must fail the build"
    fallback = re.search(r"--force-reinstall /src\s*(\)|\|\|)", install)
    assert fallback is None, "no fallback that would build an interpreted image silently"
    assert "-m shoal.check_compiled" in install, "the build must check what it installed"


def test_the_compile_extra_has_every_stub_package_mypy_checks_with():
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    extras = config["options.extras_require"]

    def names(block: str) -> set[str]:
        return {canonicalize_name(Requirement(ln).name) for ln in block.split("\n") if ln.strip()}

    compile_extra = names(extras["compile"])
    assert {"mypy", "types-protobuf", "setuptools"} <= compile_extra
    stubs = {name for name in names(extras["test"]) if name.startswith("types-")}
    assert stubs <= compile_extra, f"`make check` type-checks with {stubs - compile_extra} too"


def _setup_py(tmp_path, **env: str) -> subprocess.CompletedProcess[str]:
    """``setup.py --version`` where ``import mypyc`` fails, as in an image without the extra."""
    fake = tmp_path / "no_mypyc" / "mypyc"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("raise ImportError('mypyc is hidden by the test')\n")
    environment = {**os.environ, "PYTHONPATH": str(fake.parent), **env}
    for name in ("SHOAL_REQUIRE_COMPILED", "SHOAL_PURE_PYTHON"):
        if name not in env:
            environment.pop(name, None)
    return subprocess.run(
        [sys.executable, "setup.py", "--version"],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_setup_py_fails_without_mypyc_when_compiling_is_required(tmp_path):
    required = _setup_py(tmp_path, SHOAL_REQUIRE_COMPILED="1")
    assert required.returncode != 0
    assert "mypyc is not installed" in required.stderr
    assert "SHOAL_REQUIRE_COMPILED=1 is set: build failed" in required.stderr
    relaxed = _setup_py(tmp_path)
    assert relaxed.returncode == 0, relaxed.stderr
    assert "the hot path stays interpreted" in relaxed.stderr


def test_check_compiled_fails_an_interpreted_installation():
    command = [sys.executable, "-m", "shoal.check_compiled"]
    environment = {**os.environ, "SHOAL_PURE_PYTHON": "1"}  # imports the hot path from source
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "request hot path interpreted" in done.stdout and "SHOAL_REQUIRE_COMPILED" in done.stderr
    allowed = subprocess.run(
        [*command, "--allow-interpreted"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert allowed.returncode == 0
