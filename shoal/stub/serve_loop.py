"""The main loop's Executes, compiled: the stub runs this once per batch, and as interpreted
code (``Runtime._serve``, ``_execute`` and ``_send``) its calls cost ~3k instructions a batch."""

from __future__ import annotations

from typing import Any

from shoal.ipc import messages as msg
from shoal.ipc.model_messages import Execute, Result
from shoal.ipc.queue import Channel
from shoal.stub.direct_rings import DirectRings
from shoal.stub.executor import BatchExecutor
from shoal.stub.pump import DownPump


def serve_executes(
    pump: DownPump, direct: DirectRings, executor: BatchExecutor, bls: Any, channel: Channel
) -> msg.Message:
    """Run each Execute that comes for the main loop and send its Result, until a message of
    another kind comes: that one is returned (``bls`` is the runtime's ``BlsClient``)."""
    while True:
        message = pump.next_main()
        direct.close_detached()
        if type(message) is not Execute:
            return message
        pump.poll()
        bls.begin_batch()
        try:
            result = executor.run(message)
        finally:
            bls.end_batch()
        if result is not None:
            send_result(pump, direct, channel, result)


def send_result(pump: DownPump, direct: DirectRings, channel: Channel, result: Result) -> None:
    """A batch's Result: back on the direct ring of the worker its Execute came on, if it came
    on one, else up the channel to the core."""
    origins = pump.origins
    if origins:
        origin = origins.pop(result.batch_id, None)
        if origin is not None:
            direct.send(origin, result)
            return
    channel.send_up(msg.encode(result))
