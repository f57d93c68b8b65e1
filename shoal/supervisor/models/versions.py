"""Loaded model versions: their config, scheduler, instances and state."""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import sys
import tarfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shoal.config import ModelConfig
from shoal.core.errors import InvalidArgument, ShoalError, Unavailable
from shoal.ipc.arena import Block
from shoal.supervisor.extensions.statistics import StatsRecorder
from shoal.supervisor.instances.devices import stub_environment
from shoal.supervisor.instances.instance import (
    BlsHandler,
    ControlHandler,
    InstanceSpec,
    LoadError,
    MakeStub,
    StubInstance,
)
from shoal.supervisor.instances.process import StubLaunch, StubProcess
from shoal.supervisor.memory.segments import SegmentDirectory
from shoal.supervisor.models import environments, warmup
from shoal.supervisor.options import ArenaOptions
from shoal.supervisor.requests import classification
from shoal.supervisor.schedulers import (
    DefaultScheduler,
    Scheduler,
    SchedulerConfigError,
    arena_stager,
    make_scheduler,
)
from shoal.supervisor.schedulers.base import fail_work
from shoal.supervisor.work import Work

log = logging.getLogger("shoal")

_KIND_NAMES = {"KIND_CPU": "CPU", "KIND_GPU": "GPU", "KIND_MODEL": "MODEL", "KIND_AUTO": "AUTO"}


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    UNLOADING = "UNLOADING"


@dataclass(eq=False)
class ModelVersion:
    """One version of a model: config, scheduler and instances."""

    name: str
    version: int
    config: ModelConfig
    config_json: dict[str, Any]
    state: ModelState = ModelState.LOADING
    reason: str = ""
    scheduler: Scheduler | None = None
    instances: list[StubInstance] = field(default_factory=list)
    stats: StatsRecorder = field(init=False)
    environment: environments.StubEnvironment | None = None
    #: The ``model.py`` of the model's Python-based backend; "" when the model is its own.
    runtime_file: str = ""
    #: Why no instance is live while every restart keeps failing (None when one is live or
    #: about to be): requests are refused with it instead of waiting for an instance.
    down: str | None = None

    def __post_init__(self) -> None:
        self.stats = StatsRecorder(self.name, self.version)

    @property
    def ready(self) -> bool:
        """Loaded (it may be between two stubs of a restart: see ``serving``)."""
        return self.state is ModelState.READY

    @property
    def serving(self) -> bool:
        """Loaded and with a live instance now: what readiness reports."""
        if self.state is not ModelState.READY:
            return False
        return not self.instances or any(i.ready for i in self.instances)

    def submit(self, work: Work) -> None:
        assert self.scheduler is not None
        self.scheduler.submit(work)


class ModelLoader:
    """Starts and stops model versions with their stubs."""

    def __init__(
        self,
        directory: SegmentDirectory,
        arenas: ArenaOptions,
        free_inputs: Callable[[list[Block]], None],
        *,
        bls: BlsHandler,
        control: ControlHandler,
        trace_overhead: bool = False,
        response_cache: bool = False,
        make_stub: MakeStub = StubProcess,
    ) -> None:
        self._directory = directory
        #: Starts each instance's stub: a process, or the loopback kind in tests.
        self._make_stub = make_stub
        self._arenas = arenas
        self._free_inputs = free_inputs
        #: Serve the BLS, model-control and custom-metric calls of every instance.
        self.bls = bls
        self.control = control
        #: ``--trace-overhead``: every version records its per-stage times.
        self.trace_overhead = trace_overhead
        #: The server has a response cache (``--cache-config``).
        self.response_cache = response_cache

    def _specs(self, mv: ModelVersion) -> list[InstanceSpec]:
        config = mv.config
        model_dir = os.path.abspath(config.path)
        filename = config.default_model_filename or "model.py"  # a Python-based backend has none
        model_file = os.path.join(model_dir, str(mv.version), filename)
        config_text = json.dumps(mv.config_json)
        specs = []
        instances = list(config.instance_names())
        env = thread_env(config.parameters, len(instances))
        python = sys.executable
        if mv.environment is not None:
            python = mv.environment.python
            env = {**env, **mv.environment.env}
        for instance_name, kind, device_id in instances:
            args = {
                "model_config": config_text,
                "model_instance_kind": _KIND_NAMES.get(kind, "CPU"),
                "model_instance_name": instance_name,
                "model_instance_device_id": str(device_id),
                "model_repository": model_dir,
                "model_version": str(mv.version),
                "model_name": mv.name,
            }
            specs.append(
                InstanceSpec(
                    model_name=mv.name,
                    instance_name=instance_name,
                    init_args=args,
                    model_file=model_file,
                    runtime_file=mv.runtime_file,
                    launch=StubLaunch(
                        instance_name,
                        python=python,
                        env={
                            **env,
                            **stub_environment(config.parameters, kind, device_id, mv.name),
                        },
                    ),
                    output_arena=(
                        self._arenas.output_initial_bytes,
                        self._arenas.growth_bytes,
                        self._arenas.limit_bytes,
                    ),
                    execute_timeout=_execute_timeout(config.parameters, mv.name),
                    async_concurrency=_async_concurrency(config.parameters, mv.name),
                )
            )
        return specs

    async def start(self, mv: ModelVersion) -> None:
        """Bring up every instance; on failure the version is UNAVAILABLE with the reason."""
        if self.trace_overhead:
            mv.stats.overhead = {}
        try:
            if self.response_cache and mv.config.response_cache and mv.config.decoupled:
                raise InvalidArgument(
                    f"Response Cache does not currently support model '{mv.name}' with "
                    "'decoupled' transaction policy: remove response_cache or decoupled"
                )
            classification.labels_of(mv.config)
            model_dir = os.path.abspath(mv.config.path)
            mv.environment = await environments.prepare(
                mv.config.parameters, model_dir, os.path.join(model_dir, str(mv.version)), mv.name
            )
        except (ShoalError, OSError, tarfile.TarError) as error:
            mv.state = ModelState.UNAVAILABLE
            mv.reason = f"failed to load '{mv.name}' version {mv.version}: {error}"
            log.error("%s", mv.reason)
            return
        if mv.config.is_ensemble:  # runs in the supervisor: no stub, no scheduler
            mv.state = ModelState.READY
            log.info("successfully loaded ensemble '%s' version %d", mv.name, mv.version)
            return
        specs = self._specs(mv)
        try:
            samples = warmup.build_samples(mv.config, os.path.abspath(mv.config.path))
            scheduler = make_scheduler(
                mv.config,
                len(specs),
                lambda work: self._free_inputs(work.input_blocks),
                arena_stager(self._directory.input_arena),
            )
        except (SchedulerConfigError, warmup.WarmupError) as error:
            mv.state = ModelState.UNAVAILABLE
            mv.reason = f"failed to load '{mv.name}' version {mv.version}: {error}"
            log.error("%s", mv.reason)
            return
        mv.scheduler = scheduler
        mv.instances = [
            StubInstance(spec, self._directory, self._free_inputs, mv.stats, self._make_stub)
            for spec in specs
        ]
        for instance in mv.instances:
            instance.bls = self.bls
            instance.control = self.control
            instance.decoupled = mv.config.decoupled
            # Only a lone instance: with several, a request sent ahead to a busy one could wait
            # while another instance is idle.
            instance.send_ahead = len(mv.instances) == 1 and isinstance(scheduler, DefaultScheduler)
            instance.on_failed = lambda failed, mv=mv: self._on_instance_failed(mv, failed)
            instance.on_health = lambda _, mv=mv: self._on_instance_health(mv)
        warm_up = self._warm_up(mv.name, samples) if samples else None
        results = await asyncio.gather(
            *(i.start(scheduler.source(n), warm_up) for n, i in enumerate(mv.instances)),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            first = errors[0]
            reason = str(first) if isinstance(first, LoadError) else repr(first)
            await self.stop(mv, timeout=5.0)
            mv.state = ModelState.UNAVAILABLE
            mv.reason = f"failed to load '{mv.name}' version {mv.version}: {reason}"
            log.error("%s", mv.reason)
            return
        mv.state = ModelState.READY
        log.info("successfully loaded '%s' version %d", mv.name, mv.version)

    def _warm_up(
        self, model: str, samples: list[warmup.WarmupSample]
    ) -> Callable[[StubInstance], Awaitable[None]]:
        """What each instance runs before it is ready: every warmup sample."""
        stage = arena_stager(self._directory.input_arena)

        async def run(instance: StubInstance) -> None:
            await warmup.warm_up(
                model, instance.name, samples, stage, self._free_inputs, instance.run_now
            )

        return run

    def _on_instance_failed(self, mv: ModelVersion, instance: StubInstance) -> None:
        """An instance stopped restarting; with none left the version is unavailable."""
        if all(i.failed for i in mv.instances):
            mv.state = ModelState.UNAVAILABLE
            mv.reason = f"every instance is in a crash loop: {instance.failed}"
            if mv.scheduler is not None:  # nothing will run what is queued: fail it now
                error = Unavailable(f"model '{mv.name}' is unavailable: {mv.reason}")
                for work in mv.scheduler.close():
                    fail_work(work, error, lambda w: self._free_inputs(w.input_blocks))

    def _on_instance_health(self, mv: ModelVersion) -> None:
        """A restart failed or succeeded. With no instance live and every one failing to
        restart, requests would wait for as long as the cause lasts: queued ones fail now and
        new ones are refused (UNAVAILABLE with the reason) until an instance is back."""
        downs = [i.failed or i.down for i in mv.instances]
        if mv.serving or not all(downs):
            mv.down = None
            return
        mv.down = "; ".join(d for d in downs if d)
        if mv.scheduler is not None:
            error = Unavailable(
                f"model '{mv.name}' version {mv.version} has no live instance: {mv.down}"
            )
            for work in mv.scheduler.take_queued():
                fail_work(work, error, lambda w: self._free_inputs(w.input_blocks))

    async def drain(self, mv: ModelVersion) -> None:
        """Wait until every request queued for or running in ``mv`` has finished."""
        scheduler = mv.scheduler
        if scheduler is None:
            return
        await scheduler.wait_empty()
        await asyncio.gather(*(i.wait_idle() for i in mv.instances))

    async def stop(self, mv: ModelVersion, timeout: float) -> None:
        mv.state = ModelState.UNLOADING
        if mv.scheduler is not None:
            error = Unavailable(f"model '{mv.name}' is unloading; the request was not run")
            for work in mv.scheduler.close():
                fail_work(work, error, lambda w: self._free_inputs(w.input_blocks))
        await asyncio.gather(*(i.stop(timeout) for i in mv.instances))
        mv.state = ModelState.UNAVAILABLE
        mv.reason = "unloaded"


#: Thread-pool sizes each stub gets (torch follows OMP_NUM_THREADS).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def thread_env(
    parameters: Any, instances: int, environ: Any = os.environ, cpus: int | None = None
) -> dict[str, str]:
    """Per-stub thread counts: a model parameter of the same name, else the server's own
    environment (inherited, so not set here), else the CPUs this process may use divided by the
    model's instance count (at least 1)."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    share = str(max(1, (cpus or 1) // max(1, instances)))
    env: dict[str, str] = {}
    for name in THREAD_VARIABLES:
        if name in parameters:
            env[name] = str(parameters[name])
        elif name not in environ:
            env[name] = share
    return env


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
    """How many batches an ``async def execute`` instance runs at once (default 8)."""
    raw = parameters.get(ASYNC_CONCURRENCY_PARAMETER)
    if not raw:
        return 8
    try:
        return max(1, int(raw))
    except ValueError:
        log.warning(
            "model '%s': %s must be an integer, not %r; using 8",
            model,
            ASYNC_CONCURRENCY_PARAMETER,
            raw,
        )
        return 8
