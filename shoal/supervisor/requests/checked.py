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

#: A staged request: its record, and the input blocks it owns.
Staged = tuple[RequestRecord, list[Block]]
#: A request's inputs in client shared memory, by name (None: not read yet).
Regions = dict[str, ClientRegion] | None


class Stager:
    """Checks requests and stages their inputs for the core (``InferenceService.stage``)."""

    def __init__(
        self,
        shm: SharedMemoryRegistry,
        arena: OwnedArena,
        tracing: TraceSettings,
        directory: SegmentDirectory,
    ) -> None:
        self.shm = shm
        self.arena = arena
        self.tracing = tracing
        self.directory = directory

    def stage(self, mv: ModelVersion, request: InferRequest, regions: Regions) -> Staged:
        """Check a request and copy its inputs into the arena; ``regions``: its inputs in
        client shared memory, when read already (None: read here)."""
        shm = self.shm
        if regions is None:
            regions = read_shm_inputs(shm, request)
        summary = mv.summary
        outputs = staging.check_outputs(summary, request)  # Triton checks the outputs first
        staging.check_inputs(summary, request)
        placed = {} if mv.is_ensemble else output_regions(shm, request)
        record, blocks = staging.stage_request(summary, request, self.arena, outputs, regions)
        record.output_regions = placed
        if mv.state is not ModelState.READY:
            self.directory.free_inputs(blocks)
            raise Unavailable(f"model '{mv.name}' version {mv.version} is not ready")
        if mv.down is not None:  # it would wait for as long as the restarts keep failing
            self.directory.free_inputs(blocks)
            raise Unavailable(
                f"model '{mv.name}' version {mv.version} has no live instance: {mv.down}"
            )
        # Sampled last: a request refused above is no trace (nothing would finish it).
        record.trace_context = context = self.tracing.context_for(mv.name)
        if context and request.trace_id < 0:  # its frontend's timestamps are due: a held trace
            request.trace_id = self.tracing.hold(context)
        return record, blocks
