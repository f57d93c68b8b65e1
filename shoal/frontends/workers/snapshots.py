"""A frontend worker's snapshots of model summaries, which it checks and packs requests with.

The core sends one per model version (``requests/packed.snapshot``) when a worker first asks
(``packing_summary``); ``packing.py`` reads it per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from shoal.core.packed import reshape_sources
from shoal.frontends.workers.head_bytes import array_of_str, shape_bytes, str_bytes
from shoal.ipc.dtypes import element_size

__all__ = ["Snapshot", "Snapshots"]

#: How long a worker trusts that a model has no snapshot (the relay does not apply to it, or
#: it is not loaded) before it asks again.
_NONE_SECS: Final = 2.0
#: Snapshots kept at most (a client naming many models that do not exist fills none past it).
_MAX_KEPT: Final = 1024


class Rule:
    """One input of a snapshot, as the checks read it (``summary.InputRule``'s fields)."""

    def __init__(
        self,
        name: str,
        datatype: str,
        expected: list[int],
        reshape: list[int] | None,
        batched: bool,
    ) -> None:
        self.datatype = datatype
        #: The name and datatype as a descriptor on the wire starts (``head_bytes``).
        self.name_type = str_bytes(name) + str_bytes(datatype)
        #: Bytes per element; None for BYTES (or a datatype the checks do not know).
        self.item_size = _item_size(datatype)
        self.expected = tuple(expected)
        self.reshape = None if reshape is None else tuple(reshape)
        #: Where the reshape's -1s take their values from (``core.packed.reshape_sources``,
        #: as the core's ``summary.InputRule``).
        self.reshape_sources = reshape_sources(self.expected, self.reshape, batched)
        #: The last shape a request gave this input and its :func:`shape_bytes`: a client sends
        #: the same shape request after request. One tuple, replaced whole.
        self.last_shape: tuple[tuple[int, ...], bytes] = ((), shape_bytes(()))


def _item_size(datatype: str) -> int | None:
    try:
        return element_size(datatype)
    except KeyError:  # not a datatype the core stages: its requests take the core's way
        return None


class Snapshot:
    """A model version's summary as the core sent it (``requests/packed.snapshot``)."""

    def __init__(self, plain: list[Any]) -> None:
        generation, name, max_batch_size, budget, inputs, required, outputs = plain[:7]
        core, key_inputs, key_all, slot = plain[7:]
        self.generation: int = generation
        #: Which ``(model, version)`` the core numbered this snapshot's (a packed call names it).
        self.slot: int = slot
        self.name: str = name
        self.max_batch_size: int = max_batch_size
        self.inline_budget: int = budget
        self.inputs = {i[0]: Rule(i[0], i[1], i[2], i[3], max_batch_size > 0) for i in inputs}
        self.required: list[str] = required
        #: Every output, in order: what a request that names none asks for.
        self.outputs: list[str] = outputs
        self.output_names = frozenset(outputs)
        #: ``outputs`` packed: the record's outputs when a request names none.
        self.packed_outputs = array_of_str(outputs)
        #: What the dynamic batcher reads (``requests/packed.batching``): parameters that send
        #: a request the core's way; the inputs whose dims go into the shape key, and whether
        #: every given input does (``keyed``: the batcher reads a key at all).
        self.core_parameters: frozenset[str] = frozenset(core)
        self.key_inputs: frozenset[str] = frozenset(key_inputs)
        self.key_all: bool = key_all
        self.keyed = bool(key_inputs) or key_all


class Snapshots:
    """The snapshots a worker holds, by (model, version) as requests name them."""

    def __init__(self, ask: Callable[[str, str], list[Any] | None]) -> None:
        self._ask = ask
        self._kept: dict[tuple[str, str], Snapshot | float] = {}

    def get(self, name: str, version: str) -> Snapshot | None:
        """The snapshot to relay a request with; None: send it the core's way."""
        key = (name, version)
        kept = self._kept.get(key)
        if isinstance(kept, Snapshot):
            return kept
        now = time.monotonic()
        if kept is not None and now < kept:  # known to have none a moment ago
            return None
        plain = self._ask(name, version)
        if len(self._kept) >= _MAX_KEPT:
            self._kept.clear()
        snapshot = None if plain is None else Snapshot(plain)
        self._kept[key] = now + _NONE_SECS if snapshot is None else snapshot
        return snapshot

    def drop(self, name: str, version: str) -> None:
        """The core found the snapshot stale: the next request asks again."""
        self._kept.pop((name, version), None)
