"""The one place where the scheduling core's parts are built and wired together.

Each part takes what it needs in its constructor; the order below is the dependency order. The
one cycle (a stub's ``pb_utils.load_model`` reaches the repository manager, which starts the
stubs) is closed by handing the manager a function that builds its loader.
"""

from __future__ import annotations

import logging

from shoal.ipc.arena import OwnedArena, remove_stale_segments
from shoal.supervisor.calls.bls import BlsRouter
from shoal.supervisor.calls.control import ControlRouter, ModelControl
from shoal.supervisor.extensions.custom_metrics import CustomMetrics
from shoal.supervisor.extensions.latency_families import DEFAULT_QUANTILES, LatencySettings
from shoal.supervisor.extensions.log_settings import LogSettings
from shoal.supervisor.extensions.trace_settings import TraceSettings
from shoal.supervisor.instances.instance import MakeStub
from shoal.supervisor.instances.process import StubProcess
from shoal.supervisor.memory.cuda_pools import CudaPools
from shoal.supervisor.memory.segments import INPUT_ARENA_ID, SegmentDirectory
from shoal.supervisor.memory.system_shm import SharedMemoryRegistry
from shoal.supervisor.models.ensemble import EnsembleRunner
from shoal.supervisor.models.loaded import LoadedModels
from shoal.supervisor.models.manager import ModelRepositoryManager
from shoal.supervisor.models.versions import ModelLoader
from shoal.supervisor.options import ServerOptions
from shoal.supervisor.requests.response_cache import ResponseCache
from shoal.supervisor.schedulers.rate_limiter import RateLimiter
from shoal.supervisor.service import InferenceService

log = logging.getLogger("shoal")


def build_service(options: ServerOptions, make_stub: MakeStub = StubProcess) -> InferenceService:
    """The inference service for ``options``, with every part it uses; ``make_stub`` starts
    each instance's stub (a process; the loopback kind in unit tests)."""
    # Named segments a crashed supervisor could not unlink (memfd arenas need no cleanup).
    for name in remove_stale_segments():
        log.warning("removed a stale shared-memory segment of a dead server: %s", name)
    loaded = LoadedModels()
    input_arena = _input_arena(options, loaded)
    directory = SegmentDirectory(input_arena, CudaPools(dict(options.cuda_pool_limits)))

    free_inputs = directory.free_inputs
    custom_metrics = CustomMetrics()
    initial_traces = {k: v if isinstance(v, str) else list(v) for k, v in options.trace_settings}
    tracing = TraceSettings(lambda name: name in loaded.models, initial_traces)
    bls = BlsRouter(loaded, directory, tracing)
    cache = ResponseCache(options.cache_bytes) if options.cache_bytes > 0 else None
    rate_limiter = None
    if options.rate_limit == "execution_count":
        rate_limiter = RateLimiter(dict(options.rate_limit_resources))

    def make_loader(models: ModelControl) -> ModelLoader:
        return ModelLoader(
            directory,
            options.arenas,
            free_inputs,
            bls=bls,
            control=ControlRouter(models, custom_metrics, directory),
            trace_overhead=options.trace_overhead,
            latencies=latency_settings(options),
            response_cache=cache is not None,
            rate_limiter=rate_limiter,
            make_stub=make_stub,
        )

    service = InferenceService(
        options,
        repository=ModelRepositoryManager(options, loaded, make_loader),
        input_arena=input_arena,
        directory=directory,
        ensembles=EnsembleRunner(loaded, directory, free_inputs, tracing),
        custom_metrics=custom_metrics,
        cache=cache,
        shm=SharedMemoryRegistry(
            allow_client=options.allow_client_shm, tell_stubs=directory.broadcast
        ),
        log_settings=LogSettings.from_options(options),
        trace_settings=tracing,
    )
    if service.direct is not None:
        service.repository.loader.revoke_routes = service.direct.revoke
    return service


def _input_arena(options: ServerOptions, loaded: LoadedModels) -> OwnedArena:
    """The supervisor's input arena; each new segment is announced to every live stub."""
    arenas = options.arenas
    return OwnedArena(
        INPUT_ARENA_ID,
        initial_bytes=arenas.input_initial_bytes,
        growth_bytes=arenas.growth_bytes,
        limit_bytes=arenas.limit_bytes,
        on_new_segment=loaded.announce_segment,
    )


def latency_settings(options: ServerOptions) -> LatencySettings | None:
    """``--metrics-config``'s summaries and histograms (None: neither, the default)."""
    if not (options.summary_latencies or options.histogram_latencies):
        return None
    return LatencySettings(
        options.summary_latencies,
        options.histogram_latencies,
        options.summary_quantiles or DEFAULT_QUANTILES,
    )
