"""A request a frontend worker checked, staged and packed, as the core reads it.

The worker's side is ``frontends/workers/packing.py``; the core's, ``supervisor/requests/packed.py``
and ``InferenceService.start_packed``. Here, because both the worker link's host (a frontend)
and the service (the supervisor) name it.
"""

from __future__ import annotations

from typing import Any

from shoal.core.types import InferRequest
from shoal.ipc.arena import Block


class PackedCall:
    """One relayed request as the core reads it: ``fields`` as the worker sends them
    (``[model, version, generation, request id, batch size, timeout µs, private inputs,
    blocks]``), ``head`` its packed record, ``blocks`` the worker's blocks it names (taken by
    the core: they go back to the worker as any input block does)."""

    def __init__(self, fields: list[Any], head: bytes | memoryview, blocks: list[Block]) -> None:
        self.model_name: str = fields[0]
        self.model_version: str = fields[1]
        self.generation: int = fields[2]
        self.request_id: str = fields[3]
        self.batch_size: int = fields[4]
        self.timeout_us: int = fields[5]
        self.private_inputs: int = fields[6]
        self.head = head
        self.blocks = blocks
        #: What the answer names (no inputs: the stub has them; no outputs in a client's region).
        self.request = InferRequest(self.model_name, self.model_version, self.request_id)
        #: Set when the worker's snapshot of the model is stale (or the model is gone): it
        #: drops it and sends the request the core's own way.
        self.stale = False
