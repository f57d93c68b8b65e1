"""Messages of a model's calls to the server: BLS inference and control (model control,
custom metrics, CUDA pool blocks).

Up (stub → supervisor): :class:`BlsCall`, :class:`BlsDone`, :class:`BlsCancel`,
:class:`ControlCall`. Down (supervisor → stub): :class:`BlsReply`, :class:`ControlReply`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from shoal.ipc.records import RequestRecord, ResponseRecord


@dataclass(slots=True)
class BlsCall:
    """A model's ``InferenceRequest.exec()``: run ``request`` on another model."""

    call_id: int
    model_name: str
    model_version: int
    request: RequestRecord
    decoupled: bool

    def fields(self) -> list[Any]:
        return [
            self.call_id,
            self.model_name,
            self.model_version,
            self.request.to_wire(),
            self.decoupled,
        ]

    @classmethod
    def from_fields(cls, f: list[Any]) -> BlsCall:
        return cls(f[0], f[1], f[2], RequestRecord.from_wire(f[3]), f[4])


@dataclass(slots=True)
class BlsReply:
    """One response to a :class:`BlsCall` (``final`` ends it; a non-decoupled call has one)."""

    call_id: int
    response: ResponseRecord | None
    final: bool

    def fields(self) -> list[Any]:
        return [
            self.call_id,
            None if self.response is None else self.response.to_wire(),
            self.final,
        ]

    @classmethod
    def from_fields(cls, f: list[Any]) -> BlsReply:
        response = None if f[1] is None else ResponseRecord.from_wire(f[1])
        return cls(f[0], response, f[2])


@dataclass(slots=True)
class BlsDone:
    """The model dropped the responses of a BLS call: their blocks may be released."""

    call_id: int

    def fields(self) -> list[Any]:
        return [self.call_id]

    @classmethod
    def from_fields(cls, f: list[Any]) -> BlsDone:
        return cls(f[0])


@dataclass(slots=True)
class BlsCancel:
    """Cancel a BLS call: ``ResponseIterator.cancel()``, or the caller's request was cancelled."""

    call_id: int

    def fields(self) -> list[Any]:
        return [self.call_id]

    @classmethod
    def from_fields(cls, f: list[Any]) -> BlsCancel:
        return cls(f[0])


class ControlOp(enum.IntEnum):
    """What a model asks of the server besides inference (model control, custom metrics)."""

    LOAD_MODEL = 1  # args: [name, config json, {file key: bytes}]
    UNLOAD_MODEL = 2  # args: [name, unload_dependents]
    IS_MODEL_READY = 3  # args: [name, version (-1: latest)]
    NEW_FAMILY = 10  # args: [family id, name, description, kind]
    NEW_METRIC = 11  # args: [metric id, family id, {label: value}, buckets | None]
    UPDATE_METRIC = 12  # args: [metric id, MetricUpdate, value] (no reply)
    METRIC_VALUE = 13  # args: [metric id]
    DELETE_METRIC = 14  # args: [metric id] (no reply)
    DELETE_FAMILY = 15  # args: [family id] (no reply)
    CUDA_ALLOCATE = 20  # args: [device, nbytes] -> [device, offset, nbytes] of a pool block
    CUDA_FREE = 21  # args: [[device, offset, nbytes], ...] blocks the stub will not hand on


class MetricUpdate(enum.IntEnum):
    INCREMENT = 1
    SET = 2
    OBSERVE = 3


@dataclass(slots=True)
class ControlCall:
    """A model's request to the server; ``call_id`` 0 wants no reply."""

    call_id: int
    op: ControlOp
    args: list[Any]

    def fields(self) -> list[Any]:
        return [self.call_id, int(self.op), self.args]

    @classmethod
    def from_fields(cls, f: list[Any]) -> ControlCall:
        return cls(f[0], ControlOp(f[1]), f[2])


@dataclass(slots=True)
class ControlReply:
    """The answer to a :class:`ControlCall`: a value, or the error text."""

    call_id: int
    error: str | None
    value: Any = None

    def fields(self) -> list[Any]:
        return [self.call_id, self.error, self.value]

    @classmethod
    def from_fields(cls, f: list[Any]) -> ControlReply:
        return cls(f[0], f[1], f[2])
