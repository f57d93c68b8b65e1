"""Loaded model versions: their config, scheduler, instances and state."""

from __future__ import annotations

import asyncio
import logging
import os
import tarfile
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator

from shoal.core.errors import InvalidArgument, ShoalError, Unavailable
from shoal.ipc.arena import Block
from shoal.protos import model_config_pb2 as pb
from shoal.supervisor.extensions.latency_families import LatencySettings, for_version
from shoal.supervisor.instances.instance import (
    BlsHandler,
    ControlHandler,
    InstanceLinks,
    InstanceSpec,
    LoadError,
    MakeStub,
    StubInstance,
)
from shoal.supervisor.instances.process import StubProcess
from shoal.supervisor.memory.segments import SegmentDirectory
from shoal.supervisor.models import environments, warmup
from shoal.supervisor.models.instance_specs import instance_specs
from shoal.supervisor.models.version import ModelState, ModelVersion
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
from shoal.supervisor.schedulers.rate_limiter import LimitedInstance, RateLimiter
from shoal.supervisor.work import Work

log = logging.getLogger("shoal")


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
        latencies: LatencySettings | None = None,
        response_cache: bool = False,
        rate_limiter: RateLimiter | None = None,
        make_stub: MakeStub = StubProcess,
    ) -> None:
        self._directory = directory
        #: Starts each instance's stub: a process, or the loopback kind in tests.
        self._make_stub = make_stub
        self.arenas = arenas
        self._free_inputs = free_inputs
        #: Serve the BLS, model-control and custom-metric calls of every instance.
        self.bls = bls
        self.control = control
        #: ``--trace-overhead``: every version records its per-stage times.
        self.trace_overhead = trace_overhead
        #: ``--metrics-config`` summaries or histograms: every version gets its families.
        self.latencies = latencies
        #: The server has a response cache (``--cache-config``).
        self.response_cache = response_cache
        #: ``--rate-limit execution_count``: every instance runs under it.
        self.rate_limiter = rate_limiter
        #: Takes a version's direct routes back from the frontend workers before it drains
        #: (``direct_routes.DirectRoutes.revoke``; None: no direct dispatch).
        self.revoke_routes: Callable[[ModelVersion], Awaitable[None]] | None = None

    async def start(self, mv: ModelVersion) -> None:
        """Bring up every instance; on failure the version is UNAVAILABLE with the reason."""
        if self.trace_overhead:
            mv.stats.overhead = {}
        if self.latencies is not None:
            mv.stats.latencies = for_version(self.latencies, mv.config, self.response_cache)
        started = time.monotonic()
        if not await self._prepare(mv):
            return
        if mv.config.is_ensemble:  # runs in the supervisor: no stub, no scheduler
            mv.state = ModelState.READY
            log.info("loaded ensemble '%s' version %d", mv.name, mv.version)
        elif await self._start_stubs(mv):
            mv.state = ModelState.READY
            log.info(
                "loaded '%s' version %d in %.2f s",
                mv.name,
                mv.version,
                time.monotonic() - started,
            )

    async def _start_stubs(self, mv: ModelVersion) -> bool:
        """Plan, create and start the version's instances; False: the version failed."""
        specs = instance_specs(mv, self.arenas)
        planned = self._plan(mv, specs)
        if planned is None or not self._create_instances(mv, specs, planned[0]):
            return False
        _log_loading(mv, specs)
        return await self._start_instances(mv, *planned)

    async def _prepare(self, mv: ModelVersion) -> bool:
        """Check what the version needs beyond its config and prepare its Python environment;
        False (the version failed) when it cannot load."""
        try:
            self._check_supported(mv)
            mv.environment = await _environment(mv)
        except (ShoalError, OSError, tarfile.TarError) as error:
            _failed(mv, str(error))
            return False
        return True

    def _check_supported(self, mv: ModelVersion) -> None:
        if self.response_cache and mv.config.response_cache and mv.config.decoupled:
            raise InvalidArgument(
                f"Response Cache does not currently support model '{mv.name}' with "
                "'decoupled' transaction policy: remove response_cache or decoupled"
            )
        classification.labels_of(mv.config)

    def _plan(
        self, mv: ModelVersion, specs: list[InstanceSpec]
    ) -> tuple[Scheduler, list[warmup.WarmupSample]] | None:
        """The version's scheduler and warmup samples (None: the version failed)."""
        try:
            samples = warmup.build_samples(mv.config, os.path.abspath(mv.config.path))
            scheduler = make_scheduler(
                mv.config,
                len(specs),
                lambda work: self._free_inputs(work.input_blocks),
                arena_stager(self._directory.input_arena),
            )
        except (SchedulerConfigError, warmup.WarmupError) as error:
            _failed(mv, str(error))
            return None
        return scheduler, samples

    def _create_instances(
        self, mv: ModelVersion, specs: list[InstanceSpec], scheduler: Scheduler
    ) -> bool:
        mv.scheduler = scheduler
        try:
            gates = self._join_rate_limiter(mv)
        except ShoalError as error:
            _failed(mv, str(error))
            return False
        send_ahead = self._sends_ahead(specs, scheduler)
        mv.instances = [
            StubInstance(spec, self.links(mv, gates.get(spec.instance_name), send_ahead))
            for spec in specs
        ]
        return True

    def _sends_ahead(self, specs: list[InstanceSpec], scheduler: Scheduler) -> bool:
        # Send-ahead only for a lone instance: with several, a request sent ahead to a busy one
        # could wait while another instance is idle; and not under the rate limiter, whose grant
        # is for an execution that starts now.
        lone = len(specs) == 1 and isinstance(scheduler, DefaultScheduler)
        return lone and self.rate_limiter is None

    def links(
        self, mv: ModelVersion, gate: LimitedInstance | None, send_ahead: bool
    ) -> InstanceLinks:
        """What one instance of ``mv`` is connected to."""
        return InstanceLinks(
            self._directory,
            self._free_inputs,
            mv.stats,
            self._make_stub,
            bls=self.bls,
            control=self.control,
            decoupled=mv.config.decoupled,
            send_ahead=send_ahead,
            rate_limit=gate,
            on_failed=lambda failed: self._on_instance_failed(mv, failed),
            on_health=lambda _: self._on_instance_health(mv),
        )

    async def _start_instances(
        self, mv: ModelVersion, scheduler: Scheduler, samples: list[warmup.WarmupSample]
    ) -> bool:
        """Start every instance (each warms up first); on a failure, stop them all."""
        warm_up = self.warm_up_with(mv.name, samples) if samples else None
        for n, instance in enumerate(mv.instances):
            instance.source_index = n
        results = await asyncio.gather(
            *(i.start(scheduler.source(n), warm_up) for n, i in enumerate(mv.instances)),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self._fail_start(mv, errors[0])
        return not errors

    async def _fail_start(self, mv: ModelVersion, error: BaseException) -> None:
        """An instance failed to start: stop them all; the version fails with its reason."""
        reason = str(error) if isinstance(error, LoadError) else repr(error)
        await self.stop(mv, timeout=5.0)
        _failed(mv, reason, error.traceback if isinstance(error, LoadError) else "")

    def _join_rate_limiter(self, mv: ModelVersion) -> dict[str, LimitedInstance]:
        """Each instance's place in the rate limiter, by instance name, with its group's
        resources and priority (named as ``ModelConfig.instance_names`` names instances)."""
        limiter = self.rate_limiter
        if limiter is None:
            return {}
        members: list[LimitedInstance] = []
        by_name: dict[str, LimitedInstance] = {}
        try:
            for group in mv.config.proto.instance_group:
                for name, device in _placements(group):
                    member = limiter.register(mv.name, name, device, group.rate_limiter)
                    members.append(member)
                    by_name[name] = member
        except ShoalError:
            for member in members:
                limiter.forget(member)
            raise
        mv.rate_limited = members
        return by_name

    def warm_up_with(
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
                self._fail_all(mv.scheduler.close(), error)

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
            self._fail_all(mv.scheduler.take_queued(), error)

    def _fail_all(self, works: Iterable[Work], error: ShoalError) -> None:
        for work in works:
            fail_work(work, error, lambda w: self._free_inputs(w.input_blocks))

    async def drain(self, mv: ModelVersion) -> None:
        """Wait until every request queued for or running in ``mv`` has finished."""
        if self.revoke_routes is not None:
            await self.revoke_routes(mv)
        scheduler = mv.scheduler
        if scheduler is None:
            return
        await scheduler.wait_empty()
        await asyncio.gather(*(i.wait_idle() for i in mv.instances))

    async def stop(self, mv: ModelVersion, timeout: float) -> None:
        mv.state = ModelState.UNLOADING
        if mv.scheduler is not None:
            error = Unavailable(f"model '{mv.name}' is unloading; the request was not run")
            self._fail_all(mv.scheduler.close(), error)
        await asyncio.gather(*(i.stop(timeout) for i in [*mv.instances, *mv.retiring]))
        self._leave_rate_limiter(mv)
        mv.state = ModelState.UNAVAILABLE
        mv.reason = "unloaded"

    def _leave_rate_limiter(self, mv: ModelVersion) -> None:
        if self.rate_limiter is not None:
            for member in mv.rate_limited:
                self.rate_limiter.forget(member)
        mv.rate_limited = []


def _log_loading(mv: ModelVersion, specs: list[InstanceSpec]) -> None:
    log.info(
        "loading '%s' version %d: %d instance%s of %s",
        mv.name,
        mv.version,
        len(specs),
        "" if len(specs) == 1 else "s",
        specs[0].model_file if specs else mv.config.path,
    )


async def _environment(mv: ModelVersion) -> environments.StubEnvironment | None:
    """The version's Python environment (``EXECUTION_ENV_PATH``), unpacked if need be."""
    model_dir = os.path.abspath(mv.config.path)
    version_dir = os.path.join(model_dir, str(mv.version))
    return await environments.prepare(mv.config.parameters, model_dir, version_dir, mv.name)


def _placements(group: pb.ModelInstanceGroup) -> Iterator[tuple[str, int]]:
    """Each instance of ``group`` on each of its devices, named as ``instance_names`` names it."""
    devices = list(group.gpus) if group.kind == group.KIND_GPU else [0]
    for index in range(group.count):
        for device in devices:
            yield f"{group.name}_{index}", device


def without_repository(text: str, model_dir: str) -> str:
    """``text`` with the paths inside the model's repository made relative to it: clients
    learn which file of the model is at fault, not where the server keeps its repository."""
    repository = os.path.dirname(os.path.abspath(model_dir))
    return text.replace(repository + os.sep, "")


def _failed(mv: ModelVersion, reason: str, traceback: str = "") -> None:
    """``mv`` failed to load. The one log line of the failure has the full paths and the model's
    traceback; the reason kept for clients has neither."""
    text = f"failed to load '{mv.name}' version {mv.version}: {reason}"
    log.error("%s%s", text, f"\n{traceback}" if traceback else "")
    mv.state = ModelState.UNAVAILABLE
    mv.reason = without_repository(text, str(mv.config.path))
