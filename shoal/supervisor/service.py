"""The inference service: :class:`~shoal.core.api.CoreAPI` implemented (``compose`` wires it)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import shoal
from shoal.core.errors import Cancelled, DecoupledInfer, ShoalError, Unavailable
from shoal.core.packed import PackedCall
from shoal.core.types import (
    CudaSharedMemoryRegion,
    InferRequest,
    InferResponse,
    JsonDict,
    ModelMetadata,
    ModelStatistics,
    ParamValue,
    RepositoryEntry,
    ServerMetadata,
    SharedMemoryRegion,
)
from shoal.ipc.arena import Block, OwnedArena
from shoal.ipc.records import RequestRecord
from shoal.supervisor import direct_routes
from shoal.supervisor.drain import EXITING, DrainGate
from shoal.supervisor.extensions import EXTENSIONS
from shoal.supervisor.extensions.custom_metrics import CustomMetrics
from shoal.supervisor.extensions.log_settings import LogSettings
from shoal.supervisor.extensions.trace_settings import TraceChange, TraceSettings, TraceValue
from shoal.supervisor.memory.segments import SegmentDirectory
from shoal.supervisor.memory.system_shm import Held, SharedMemoryRegistry
from shoal.supervisor.models import describe
from shoal.supervisor.models.ensemble import EnsembleRunner
from shoal.supervisor.models.manager import ModelRepositoryManager
from shoal.supervisor.models.version import ModelVersion
from shoal.supervisor.options import ServerOptions
from shoal.supervisor.promise import Promise, Settled
from shoal.supervisor.requests import classification, client_shm, packed, staging, streaming, traced
from shoal.supervisor.requests.answers import Answer, in_task, nothing
from shoal.supervisor.requests.cached import cache_hit, cache_insert
from shoal.supervisor.requests.checked import Regions, Staged, Stager
from shoal.supervisor.requests.relayed import Relay, record_success, relay_completed, relays
from shoal.supervisor.requests.response_cache import ResponseCache, request_key
from shoal.supervisor.requests.responses import response_of
from shoal.supervisor.schedulers.default import DefaultScheduler
from shoal.supervisor.work import Completion, Work

log = logging.getLogger("shoal")


class InferenceService:
    """Owns the input arena, the model repository manager and the client shm registry."""

    def __init__(
        self,
        options: ServerOptions,
        *,
        repository: ModelRepositoryManager,
        input_arena: OwnedArena,
        directory: SegmentDirectory,
        ensembles: EnsembleRunner,
        custom_metrics: CustomMetrics,
        cache: ResponseCache | None,
        shm: SharedMemoryRegistry,
        log_settings: LogSettings,
        trace_settings: TraceSettings,
    ) -> None:
        """Built by :func:`shoal.supervisor.compose.build_service`, which wires the parts."""
        self.options = options
        self.repository = repository
        self.input_arena = input_arena
        self.directory = directory
        self.ensembles = ensembles
        self.custom_metrics = custom_metrics
        #: ``--cache-config local,size=N``: shared by every model whose config enables it.
        self.cache = cache
        self.shm = shm
        self.logging = log_settings
        self.tracing = trace_settings
        self.stager = Stager(shm, input_arena, trace_settings, directory)
        #: Not live: shutting down, or the repository unreadable with --exit-on-error=false.
        self.live = True
        self.gate = DrainGate()
        #: Its loop once it loads models: futures made without get_running_loop's getpid.
        self._loop: asyncio.AbstractEventLoop | None = None
        #: What calls back the promises of :meth:`start_infer`, once per loop turn.
        self._settled = Settled()
        #: The model versions packed calls name by number (``requests/packed.py``).
        self._packing = packed.PackingSlots(repository.loaded)
        self.direct = direct_routes.made(options, self._packing, self.gate, trace_settings, cache)

    @property
    def failed(self) -> dict[str, str]:
        return self.repository.failed

    # -- lifecycle --------------------------------------------------------------------------

    async def load_repository(self) -> dict[str, str]:
        """Load the control mode's startup models; returns those that failed, with why."""
        self._loop = asyncio.get_running_loop()
        return await self.repository.load_startup()

    def begin_drain(self) -> None:
        """Refuse new inference and report not live / not ready (503), as Triton does on exit."""
        self.gate.close()

    async def shutdown(self, timeout: float) -> None:
        """Stop every model (finalize, then signals) and free the arenas and regions."""
        self.live = False
        await self.repository.shutdown(timeout)
        self.shm.close()
        self.directory.cuda.close()  # after the stubs: they closed their handles by exiting
        self.input_arena.close()

    # -- health and metadata ----------------------------------------------------------------

    def is_live(self) -> bool:
        if self.gate.closed:
            raise Unavailable(EXITING)
        return self.live

    def is_ready(self) -> bool:
        if self.gate.closed:
            raise Unavailable(EXITING)
        if not self.live:
            return False
        return not self.options.strict_readiness or self.repository.all_ready()

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(self.options.server_id, shoal.__version__, EXTENSIONS)

    def model_ready(self, name: str, version: str = "") -> bool:
        """Loaded and with a live instance (false between a stub's death and its restart)."""
        try:
            return self.repository.resolve(name, version).serving
        except ShoalError:
            return False

    async def model_ready_now(self, name: str, version: str = "") -> bool:
        try:
            mv = self.repository.resolve(name, version)
        except ShoalError:
            return False
        if not mv.serving:
            return False
        asking = [instance.ask_is_ready() for instance in mv.instances if instance.user_ready]
        return all(await asyncio.gather(*asking))  # (none asking: gather() gives [], all True)

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        return describe.metadata(self.repository, name, version)

    async def model_decoupled(self, name: str, version: str = "") -> bool:
        return describe.decoupled(self.repository, name, version)

    def model_config(self, name: str, version: str = "") -> JsonDict:
        versions = self.repository.models.get(name)
        if versions and not version:
            # The config is served even while the model is not ready, as Triton does.
            return max(versions.values(), key=lambda mv: mv.version).config_json
        return self.repository.resolve(name, version).config_json

    # -- inference --------------------------------------------------------------------------

    async def infer(self, request: InferRequest) -> InferResponse:
        self.gate.enter(request.model_name)
        held = client_shm.held_regions(self.shm, request)
        try:
            mv = self.resolve(request)
            started = time.monotonic_ns()
            try:
                return await self._infer(mv, request, held)
            except (ShoalError, asyncio.CancelledError) as error:  # (cancelled: the client left)
                reason = error.reason if isinstance(error, ShoalError) else Cancelled.reason
                mv.stats.failure(time.monotonic_ns() - started, reason)
                raise
        finally:
            self.shm.release(held)
            self.gate.leave()

    def resolve(self, request: InferRequest) -> ModelVersion:
        """The model version a request names (NotFound or Unavailable when there is none)."""
        return self.repository.loaded.resolve(request.model_name, request.model_version)

    def stage(self, mv: ModelVersion, request: InferRequest, regions: Regions = None) -> Staged:
        """Check a request and stage its inputs (for the core and streams: ``checked.py``)."""
        return self.stager.stage(mv, request, regions)

    def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """Every response of a request: one for most models, any number for a decoupled one."""
        return streaming.responses(self, request)

    async def _infer(self, mv: ModelVersion, request: InferRequest, held: Held) -> InferResponse:
        started = time.monotonic_ns()
        if mv.config.decoupled:
            raise DecoupledInfer(mv.name)
        classes = staging.classes_asked(request, mv.config)
        key: bytes | None = None
        regions: Regions = None
        lookup_ns = 0
        if self.cache is not None and mv.config.response_cache and not mv.config.sequence_batching:
            lookup_started = time.monotonic_ns()
            regions = client_shm.read_shm_inputs(self.shm, request)
            key = request_key(request, mv.name, mv.version)
            cached = self.cache.get(key) if key is not None else None
            if cached is not None:
                return cache_hit(self.shm, mv, request, cached, classes, started, lookup_started)
            lookup_ns = time.monotonic_ns() - lookup_started
        record, blocks = self.stage(mv, request, regions)
        if mv.is_ensemble:

            def finish(response: InferResponse) -> None:  # before it counts as a success
                if key is not None:
                    cache_insert(self.cache, mv, key, response, lookup_ns)
                if classes:
                    classification.apply(response, mv.config, classes)

            batch = staging.batch_size(mv.summary, request)
            return await self.ensembles.run(mv, request, record, blocks, started, batch, finish)
        work = self._submit(mv, staging.batch_size(mv.summary, request), record, blocks, started)
        try:
            completion = await work.awaited()
        except asyncio.CancelledError:
            work.cancel()
            raise
        finally:  # (answered: the stub is done with it; else it may not be)
            client_shm.keep_inside(self.shm, work, held)
        return self._answer(mv, request, work, completion, started, classes, key, lookup_ns)

    def start_infer(
        self, request: InferRequest, done: Answer, relay: Relay | None = None
    ) -> Callable[[], object]:
        """:meth:`infer` without a coroutine or a task per request (the frontend workers' link):
        ``done(response, None)`` or ``done(None, error)`` is called once, maybe before this
        returns; the function returned cancels the request (the client went away). ``relay``
        takes the completion instead of a response, where :func:`relays` (errors: ``done``)."""
        mv = self._plain_version(request)
        if mv is None:
            return in_task(self.infer(request), done)
        started = time.monotonic_ns()
        try:
            self.gate.enter(request.model_name)
            try:
                classes = staging.classes_asked(request, mv.config)
                record, blocks = self.stage(mv, request)
            except ShoalError as error:
                mv.stats.failure(time.monotonic_ns() - started, error.reason)
                self.gate.leave()
                raise
        except ShoalError as error:
            done(None, error)
            return nothing
        promise = Promise(self._settled)
        batch_size = staging.batch_size(mv.summary, request)
        work = self._submit(mv, batch_size, record, blocks, started, promise)
        relay = relays(relay, record, classes)
        work.relayed = relay is not None  # (read once its Result arrives, on a later callback)
        promise.add_done_callback(
            _Completed(self, mv, request, work, started, classes, done, relay)
        )
        return work.cancel

    def packing_summary(self, name: str, version: str = "") -> list[Any] | None:
        return packed.summary_for(self._packing, name, version, self.cache is None)

    def start_packed(
        self, call: PackedCall, done: Answer, relay: Relay | None = None
    ) -> Callable[[], object] | None:
        """:meth:`start_infer` for a request a worker checked and packed: returns what cancels
        it, or None when the core's own path must take it (its errors are the core's own)."""
        started = time.monotonic_ns()
        if (admitted := packed.admit(call, self._packing, self.gate, self.tracing)) is None:
            return None
        mv, record, request = admitted
        promise, key = Promise(self._settled), call.shape_key  # the tag: _batching.work_key
        work = self._submit(mv, call.batch_size, record, call.blocks, started, promise, key)
        work.relayed = relay is not None
        promise.add_done_callback(
            _Completed(self, mv, request, work, started, packed.NO_CLASSES, done, relay)
        )
        return work.cancel

    def completed(self, call: _Completed, promise: Promise) -> None:
        """Answer a request of :meth:`start_infer` whose work is done."""
        mv, done, started = call.mv, call.done, call.started
        try:
            if promise.cancelled():
                mv.stats.failure(time.monotonic_ns() - started, Cancelled.reason)
                done(None, asyncio.CancelledError())
                return
            completion = promise.result()
            if call.relay is not None:
                relay_completed(mv, call.work, completion, started, call.relay)
                return
            response = self._answer(mv, call.request, call.work, completion, started, call.classes)
        except ShoalError as error:
            mv.stats.failure(time.monotonic_ns() - started, error.reason)
            done(None, error)
        except Exception as error:  # a bug: the caller's answer still, never a hang
            done(None, error)
        else:
            done(response, None)
        finally:
            client_shm.let_go(self.shm, call.work, call.held)
            self.gate.leave()

    def _plain_version(self, request: InferRequest) -> ModelVersion | None:
        """The request's model version when plain (no ensemble, decoupled model or cache)."""
        try:
            mv = self.resolve(request)
        except ShoalError:
            return None
        return mv if mv.plain and self.cache is None else None

    def _submit(
        self,
        mv: ModelVersion,
        batch_size: int,
        record: RequestRecord,
        blocks: list[Block],
        started: int,
        promise: Promise | None = None,
        tag: object = None,
    ) -> Work:
        """Hand a staged request to its scheduler; awaited through a Future, or ``promise``."""
        future: asyncio.Future[Completion] | Promise | None = promise
        if future is None:
            future = (self._loop or asyncio.get_running_loop()).create_future()
        work = Work(record, blocks, future, batch_size, tag)
        if record.trace_context:  # sampled (TraceSettings.context_for): its trace begins
            traced.submitted(self.tracing, mv, work, started, self.directory.view)
        if mv.stats.overhead is not None:  # --trace-overhead
            mv.stats.stage("stage", work.enqueued_ns - started)
        scheduler = mv.scheduler  # mv.submit, without its (interpreted) call
        if isinstance(scheduler, DefaultScheduler):  # compiled: a native call, not a generic one
            scheduler.submit(work)
        else:
            assert scheduler is not None
            scheduler.submit(work)
        return work

    def _answer(
        self,
        mv: ModelVersion,
        request: InferRequest,
        work: Work,
        completion: Completion,
        started: int,
        classes: dict[str, int],
        key: bytes | None = None,
        lookup_ns: int = 0,
    ) -> InferResponse:
        """The response of a completed request, with its statistics."""
        response = response_of(mv, request, completion)
        if key is not None:
            cache_insert(self.cache, mv, key, response, lookup_ns)
        try:
            if classes:
                classification.classify(response, mv.config, classes)
            client_shm.write_shm_outputs(self.shm, request, response)
        except ShoalError:
            response.release()
            raise
        record_success(mv, work, completion, started)
        return response

    # -- extensions: statistics, repository, shared memory, logging, tracing ----------------
    def model_statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        return describe.statistics(self.repository, name, version)

    def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        return self.repository.index(ready_only)

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        await self.repository.load(name, config_json, files)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        await self.repository.unload(name, unload_dependents)

    def register_system_shm(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.shm.register(name, key, offset, byte_size)

    def unregister_system_shm(self, name: str = "") -> None:
        self.shm.unregister(name)

    def system_shm_status(self, name: str = "") -> list[SharedMemoryRegion]:
        return self.shm.status(name)

    def register_cuda_shm(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        self.shm.register_cuda(name, raw_handle, device_id, byte_size)

    def unregister_cuda_shm(self, name: str = "") -> None:
        self.shm.unregister_cuda(name)

    def cuda_shm_status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        return self.shm.cuda_status(name)

    def log_settings(self) -> dict[str, ParamValue]:
        return self.logging.current()

    def update_log_settings(self, settings: dict[str, ParamValue]) -> dict[str, ParamValue]:
        return self.logging.update(settings)

    def trace_settings(self, model: str = "") -> dict[str, TraceValue]:
        return self.tracing.current(model)

    def update_trace_settings(
        self, changes: dict[str, TraceChange], model: str = ""
    ) -> dict[str, TraceValue]:
        return self.tracing.update(changes, model)

    def frontend_trace(self, trace_id: int, timestamps: list[tuple[str, int]]) -> None:
        self.tracing.frontend(trace_id, timestamps)


class _Completed:
    """A :meth:`InferenceService.start_infer` request's callback: one object, where a compiled
    closure is two (its environment and the function) with every captured name in both."""

    def __init__(
        self,
        service: InferenceService,
        mv: ModelVersion,
        request: InferRequest,
        work: Work,
        started: int,
        classes: dict[str, int],
        done: Answer,
        relay: Relay | None,
    ) -> None:
        self.service = service
        self.mv = mv
        self.request = request
        self.work = work
        self.started = started
        self.classes = classes
        self.done = done
        #: Where the completion goes instead of a response to ``done`` (None: ``done``).
        self.relay = relay
        self.held = client_shm.held_regions(service.shm, request)  # (staged this loop turn)

    def __call__(self, promise: Promise) -> None:
        self.service.completed(self, promise)
