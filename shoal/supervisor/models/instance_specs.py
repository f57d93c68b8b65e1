"""From a model version to the specs of its instances: each stub's ``initialize`` arguments,
interpreter and environment (thread counts, devices), output arena and execute limits."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, Protocol

from shoal.config import ModelConfig
from shoal.supervisor.instances.devices import stub_environment
from shoal.supervisor.instances.instance import InstanceSpec
from shoal.supervisor.instances.process import StubLaunch
from shoal.supervisor.models.environments import StubEnvironment
from shoal.supervisor.options import ArenaOptions

log = logging.getLogger("shoal")

_KIND_NAMES = {"KIND_CPU": "CPU", "KIND_GPU": "GPU", "KIND_MODEL": "MODEL", "KIND_AUTO": "AUTO"}


class VersionParts(Protocol):
    """What a spec needs of a model version (a ``ModelVersion``)."""

    name: str
    version: int
    config: ModelConfig
    config_json: dict[str, Any]
    runtime_file: str
    environment: StubEnvironment | None


def instance_specs(mv: VersionParts, arenas: ArenaOptions) -> list[InstanceSpec]:
    """One spec per instance of ``mv``, in Triton's order."""
    instances = list(mv.config.instance_names())
    specs = _Specs(mv, arenas, len(instances))
    return [specs.spec(name, kind, device_id) for name, kind, device_id in instances]


class _Specs:
    """What the instances of one version share, and each one's spec."""

    def __init__(self, mv: VersionParts, arenas: ArenaOptions, count: int) -> None:
        config = mv.config
        self.mv = mv
        self.model_dir = os.path.abspath(config.path)
        filename = config.default_model_filename or "model.py"  # a Python-based backend: none
        self.model_file = os.path.join(self.model_dir, str(mv.version), filename)
        self.python, self.env = _interpreter(config, count, mv.environment)
        self.config_text = json.dumps(mv.config_json)
        self.output_arena = (arenas.output_initial_bytes, arenas.growth_bytes, arenas.limit_bytes)
        self.execute_timeout = _execute_timeout(config.parameters, mv.name)
        self.async_concurrency = _async_concurrency(config.parameters, mv.name)

    def spec(self, instance: str, kind: str, device_id: int) -> InstanceSpec:
        parameters = self.mv.config.parameters
        device_env = stub_environment(parameters, kind, device_id, self.mv.name)
        return InstanceSpec(
            model_name=self.mv.name,
            instance_name=instance,
            init_args=self._init_args(instance, kind, device_id),
            model_file=self.model_file,
            runtime_file=self.mv.runtime_file,
            launch=StubLaunch(instance, python=self.python, env={**self.env, **device_env}),
            output_arena=self.output_arena,
            execute_timeout=self.execute_timeout,
            async_concurrency=self.async_concurrency,
        )

    def _init_args(self, instance: str, kind: str, device_id: int) -> dict[str, str]:
        """Triton's seven ``initialize(args)`` keys, in Triton's order."""
        return {
            "model_config": self.config_text,
            "model_instance_kind": _KIND_NAMES.get(kind, "CPU"),
            "model_instance_name": instance,
            "model_instance_device_id": str(device_id),
            "model_repository": self.model_dir,
            "model_version": str(self.mv.version),
            "model_name": self.mv.name,
        }


def _interpreter(
    config: ModelConfig, instances: int, environment: StubEnvironment | None
) -> tuple[str, dict[str, str]]:
    """The Python a stub runs on and the variables it gets: the model's own environment's
    when it has one, over the thread counts it asked for."""
    env = thread_env(config.parameters, instances)
    if environment is None:
        return sys.executable, env
    return environment.python, {**env, **environment.env}


#: Thread-pool sizes a stub may be given (torch follows OMP_NUM_THREADS).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: The model parameter that asks shoal to size them: ``auto`` (the CPUs this server may use
#: divided by the model's instance count) or a number of threads.
THREADS_PARAMETER = "SHOAL_THREADS_PER_INSTANCE"


def thread_env(
    parameters: Any, instances: int, environ: Any = os.environ, cpus: int | None = None
) -> dict[str, str]:
    """Thread counts set for a model's stubs: none unless asked, as in Triton, where a stub
    inherits the server's environment. A model asks with a parameter of a variable's own name
    (that value) or with ``SHOAL_THREADS_PER_INSTANCE`` (every variable the server's
    environment leaves unset)."""
    env = {name: str(parameters[name]) for name in THREAD_VARIABLES if name in parameters}
    asked = str(parameters.get(THREADS_PARAMETER, "")).strip().lower()
    if not asked:
        return env
    if asked == "auto":
        share = _auto_share(cpus, instances)
    elif asked.isdigit() and int(asked) > 0:
        share = asked
    else:
        log.warning(
            "%s must be 'auto' or a positive number of threads, not %r; ignored",
            THREADS_PARAMETER,
            asked,
        )
        return env
    _fill_unset(env, share, environ)
    return env


def _auto_share(cpus: int | None, instances: int) -> str:
    """The CPUs this process may use, shared among the instances."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return str(max(1, (cpus or os.cpu_count() or 1) // max(1, instances)))


def _fill_unset(env: dict[str, str], share: str, environ: Any) -> None:
    """Each thread variable neither the model nor the server's environment sets."""
    for name in THREAD_VARIABLES:
        if name not in env and name not in environ:
            env[name] = share


EXECUTE_TIMEOUT_PARAMETER = "execute_timeout_seconds"


def _execute_timeout(parameters: Mapping[str, str], model: str) -> float | None:
    """The model's ``execute_timeout_seconds`` parameter (a stuck execute kills its stub)."""
    raw = parameters.get(EXECUTE_TIMEOUT_PARAMETER)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        log.warning(
            "model '%s': %s must be a number of seconds, not %r; ignored",
            model,
            EXECUTE_TIMEOUT_PARAMETER,
            raw,
        )
        return None
    return value if value > 0 else None


ASYNC_CONCURRENCY_PARAMETER = "async_execute_concurrency"


def _async_concurrency(parameters: Mapping[str, str], model: str) -> int:
    """How many batches an ``async def execute`` instance runs at once: 1 unless the model
    asks for more, as Triton runs a non-decoupled coroutine to completion before the next
    batch (the stub reads the same parameter)."""
    raw = parameters.get(ASYNC_CONCURRENCY_PARAMETER)
    if not raw:
        return 1
    try:
        return max(1, int(raw))
    except ValueError:
        log.warning(
            "model '%s': %s must be an integer, not %r; using 1",
            model,
            ASYNC_CONCURRENCY_PARAMETER,
            raw,
        )
        return 1
