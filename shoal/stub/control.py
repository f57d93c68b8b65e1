"""Model control (``pb_utils.load_model`` …) and custom metrics, as calls to the supervisor."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal.ipc import messages as msg
from shoal.stub.pump import DownPump

Op = msg.ControlOp


class ControlError(Exception):
    """The supervisor refused a control call; the text says why."""


class ControlClient:
    """Round trips for calls that answer; fire-and-forget for metric updates (the ring keeps
    their order, so a later ``value()`` sees every earlier update)."""

    def __init__(self, pump: DownPump, send: Callable[[msg.Message], None]) -> None:
        self._pump = pump
        self._send = send

    def call(self, op: msg.ControlOp, *args: Any) -> Any:
        reply = self._exchange(msg.ControlCall(self._pump.new_call_id(), op, list(args)))
        if reply.error is not None:
            raise ControlError(reply.error)
        return reply.value

    def _exchange(self, call: msg.ControlCall) -> msg.ControlReply:
        """Send ``call`` and wait for its reply."""
        self._pump.expect(call.call_id)
        try:
            self._send(call)
            reply = self._pump.next_reply(call.call_id)
        finally:
            self._pump.forget(call.call_id)
        assert isinstance(reply, msg.ControlReply)
        return reply

    def tell(self, op: msg.ControlOp, *args: Any) -> None:
        self._send(msg.ControlCall(0, op, list(args)))

    # -- pb_utils.load_model / unload_model / is_model_ready ---------------------------------

    def load_model(self, model_name: str, config: str, files: dict[str, bytes]) -> None:
        self._model_call(Op.LOAD_MODEL, model_name, config, files)

    def unload_model(self, model_name: str, unload_dependents: bool) -> None:
        self._model_call(Op.UNLOAD_MODEL, model_name, unload_dependents)

    def is_model_ready(self, model_name: str, model_version: int) -> bool:
        return bool(self._model_call(Op.IS_MODEL_READY, model_name, model_version))

    def _model_call(self, op: msg.ControlOp, *args: Any) -> Any:
        from shoal.stub import pb_utils

        try:
            return self.call(op, *args)
        except ControlError as error:
            raise pb_utils.TritonModelException(str(error)) from None


_UPDATES = {
    "increment": msg.MetricUpdate.INCREMENT,
    "set": msg.MetricUpdate.SET,
    "observe": msg.MetricUpdate.OBSERVE,
}


class StubMetrics:
    """``pb_utils.MetricFamily`` / ``Metric`` backed by the supervisor's custom-metric registry."""

    def __init__(self, control: ControlClient) -> None:
        self._control = control
        self._next = 0

    def _new_id(self) -> int:
        self._next += 1
        return self._next

    def new_family(self, name: str, description: str, kind: int) -> int:
        family = self._new_id()
        self._call(Op.NEW_FAMILY, family, name, description, kind)
        return family

    def new_metric(self, family: int, labels: dict[str, str], buckets: list[float] | None) -> int:
        metric = self._new_id()
        self._call(Op.NEW_METRIC, metric, family, labels, buckets)
        return metric

    def update(self, metric: int, op: str, value: float) -> None:
        self._control.tell(Op.UPDATE_METRIC, metric, int(_UPDATES[op]), value)

    def value(self, metric: int) -> float:
        return float(self._call(Op.METRIC_VALUE, metric))

    def delete_metric(self, metric: int) -> None:
        self._control.tell(Op.DELETE_METRIC, metric)

    def delete_family(self, family: int) -> None:
        self._control.tell(Op.DELETE_FAMILY, family)

    def _call(self, op: msg.ControlOp, *args: Any) -> Any:
        from shoal.stub import pb_utils

        try:
            return self._control.call(op, *args)
        except ControlError as error:
            raise pb_utils.TritonModelException(str(error)) from None
