"""A request checked against its model version and staged in the input arena, by the core."""

from __future__ import annotations

from shoal.core.errors import Unavailable
from shoal.core.types import InferRequest
from shoal.ipc.arena import Block, OwnedArena
from shoal.ipc.records import RequestRecord
from shoal.supervisor.extensions.trace_settings import TraceSettings
from shoal.supervisor.memory.segments import SegmentDirectory
from shoal.supervisor.memory.system_shm import SharedMemoryRegistry
from shoal.supervisor.models.version import ModelState, ModelVersion
from shoal.supervisor.requests import staging
from shoal.supervisor.requests.client_shm import ClientRegion, output_regions, read_shm_inputs


def stage(
    mv: ModelVersion,
    request: InferRequest,
    regions: dict[str, ClientRegion] | None,
    shm: SharedMemoryRegistry,
    arena: OwnedArena,
    tracing: TraceSettings,
    directory: SegmentDirectory,
) -> tuple[RequestRecord, list[Block]]:
    """Check a request and copy its inputs into ``arena``; ``regions``: its inputs in client
    shared memory, when read already (None: read here)."""
    if regions is None:
        regions = read_shm_inputs(shm, request)
    summary = mv.summary
    outputs = staging.check_outputs(summary, request)  # Triton checks the outputs first
    staging.check_inputs(summary, request)
    placed = {} if mv.is_ensemble else output_regions(shm, request)
    record, blocks = staging.stage_request(summary, request, arena, outputs, regions)
    record.output_regions = placed
    record.trace_context = tracing.context_for(mv.name)
    if mv.state is not ModelState.READY:
        directory.free_inputs(blocks)
        raise Unavailable(f"model '{mv.name}' version {mv.version} is not ready")
    if mv.down is not None:  # it would wait for as long as the restarts keep failing
        directory.free_inputs(blocks)
        raise Unavailable(f"model '{mv.name}' version {mv.version} has no live instance: {mv.down}")
    return record, blocks
