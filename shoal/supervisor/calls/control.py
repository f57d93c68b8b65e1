"""Calls models make besides inference: model control, custom metrics, CUDA pool blocks."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from shoal.core.errors import ShoalError
from shoal.ipc import messages as msg
from shoal.ipc.cuda import CudaPoolExhausted
from shoal.ipc.tensor import CudaLocation
from shoal.supervisor.extensions.custom_metrics import CustomMetrics
from shoal.supervisor.memory.segments import SegmentDirectory

if TYPE_CHECKING:
    from shoal.supervisor.instances.channel import StubChannel
    from shoal.supervisor.instances.spec import Caller

log = logging.getLogger("shoal")
Op = msg.ControlOp
_PENDING: set[asyncio.Future[None]] = set()


class ModelControl(Protocol):
    async def load(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None: ...

    async def unload(self, name: str, unload_dependents: bool = False) -> None: ...

    def model_ready(self, name: str, version: str) -> bool: ...


class ControlRouter:
    """Answers a stub's ControlCalls; metric updates are applied in the order they came."""

    def __init__(
        self, models: ModelControl, metrics: CustomMetrics, directory: SegmentDirectory
    ) -> None:
        self._models = models
        self.metrics = metrics
        self._directory = directory
        self._tasks: set[asyncio.Task[None]] = set()

    def handle(self, caller: Caller, proc: StubChannel, call: msg.ControlCall) -> None:
        if call.op in (Op.LOAD_MODEL, Op.UNLOAD_MODEL):
            task = asyncio.create_task(self._model_call(proc, call))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        if call.op is Op.CUDA_ALLOCATE:
            self._cuda_allocate(proc, call)
            return
        if call.op is Op.CUDA_FREE:
            self._cuda_free(caller, proc, call)
            return
        try:
            value = self._now(proc.pid, call)
        except ShoalError as error:
            self._reply(proc, call, error.message, None)
        else:
            self._reply(proc, call, None, value)

    def _cuda_free(self, caller: Caller, proc: StubChannel, call: msg.ControlCall) -> None:
        try:
            blocks = [CudaLocation(*map(int, wire)) for wire in call.args]
        except (TypeError, ValueError):
            log.error("[%s] malformed CUDA_FREE %r ignored", caller.name, call.args)
            return
        self._directory.cuda.give_back(proc.pid, blocks)

    def _cuda_allocate(self, proc: StubChannel, call: msg.ControlCall) -> None:
        """A pool block for a stub's GPU tensor; its chunk's handle goes first if it is new to
        the stub. A refusal is the reply's error, which fails only that response; a device
        whose pool is disabled (a limit of 0) answers no block, and the stub sends the tensor
        through the host instead."""
        try:
            device, nbytes = (int(arg) for arg in call.args)
        except (TypeError, ValueError):
            self._reply(proc, call, f"malformed CUDA_ALLOCATE arguments {call.args!r}", None)
            return
        if proc.returncode is not None:
            return  # exited already: nobody waits for the block
        if self._directory.cuda.disabled(device):
            self._reply(proc, call, None, None)
            return
        location = self._allocate(proc, call, device, nbytes)
        if location is not None:
            self._hand_over(proc, call, location)

    def _allocate(
        self, proc: StubChannel, call: msg.ControlCall, device: int, nbytes: int
    ) -> CudaLocation | None:
        """The block, or None once the refusal is answered."""
        try:
            return self._directory.cuda.allocate(proc.pid, device, nbytes)
        except (CudaPoolExhausted, ShoalError) as error:
            text = error.message if isinstance(error, ShoalError) else str(error)
            self._reply(proc, call, text, None)
        except Exception as error:  # a CUDA error: the stub must get an answer all the same
            log.exception("CUDA pool of device %d: allocating %d bytes failed", device, nbytes)
            self._reply(proc, call, f"CUDA pool of device {device}: {error}", None)
        return None

    def _hand_over(self, proc: StubChannel, call: msg.ControlCall, location: CudaLocation) -> None:
        try:
            proc.forward([location], self._directory)
        except OSError:
            self._directory.cuda.give_back(proc.pid, [location])  # the stub is gone
            return
        self._reply(proc, call, None, [location.device, location.offset, location.nbytes])

    def forget_process(self, proc: StubChannel) -> None:
        self.metrics.forget(proc.pid)

    def _now(self, owner: int, call: msg.ControlCall) -> Any:
        args = call.args
        match call.op:
            case Op.IS_MODEL_READY:
                return self._models.model_ready(args[0], "" if args[1] < 0 else str(args[1]))
            case Op.NEW_FAMILY:
                self.metrics.new_family(owner, args[0], args[1], args[2], args[3])
            case Op.NEW_METRIC:
                self.metrics.new_metric(owner, args[0], args[1], args[2], args[3])
            case Op.UPDATE_METRIC:
                self.metrics.update(owner, args[0], args[1], args[2])
            case Op.METRIC_VALUE:
                return self.metrics.value(owner, args[0])
            case Op.DELETE_METRIC:
                self.metrics.delete_metric(owner, args[0])
            case Op.DELETE_FAMILY:
                self.metrics.delete_family(owner, args[0])
        return None

    async def _model_call(self, proc: StubChannel, call: msg.ControlCall) -> None:
        try:
            await self._change_model(call)
        except ShoalError as error:
            verb = "load" if call.op is Op.LOAD_MODEL else "unload"
            self._reply(proc, call, f"Failed to {verb} model: {error.message}", None)
            return
        self._reply(proc, call, None, None)

    async def _change_model(self, call: msg.ControlCall) -> None:
        args = call.args
        if call.op is Op.LOAD_MODEL:
            await self._models.load(args[0], args[1] or None, args[2] or None)
        else:
            await self._models.unload(args[0], bool(args[1]))

    @staticmethod
    def _reply(proc: StubChannel, call: msg.ControlCall, error: str | None, value: Any) -> None:
        if call.call_id == 0:
            if error is not None:
                log.warning("a model's metric update failed: %s", error)
            return
        _send_soon(proc, msg.ControlReply(call.call_id, error, value))


def _send_soon(proc: StubChannel, reply: msg.ControlReply) -> None:
    """Send ``reply`` now, or once the stub's ring has room."""
    if not proc.send(reply):
        task = asyncio.ensure_future(proc.send_async(reply))
        _PENDING.add(task)
        task.add_done_callback(_PENDING.discard)
