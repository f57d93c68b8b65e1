import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Streams ticks until the client cancels, then says so in the log and ends with a
    CANCELLED error response (FINAL), as a Triton model honouring cancellation does."""

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._tick, args=(request,)).start()
        return None

    def _tick(self, request):
        sender = request.get_response_sender()
        tick = 0
        deadline = time.monotonic() + 30
        while not request.is_cancelled() and time.monotonic() < deadline:
            sender.send(
                pb_utils.InferenceResponse([pb_utils.Tensor("TICK", np.array([tick], np.int32))])
            )
            tick += 1
            time.sleep(0.01)
        pb_utils.Logger.log_info(f"decoupled_until_cancel: cancelled={request.is_cancelled()}")
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if request.is_cancelled():
            error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
            sender.send(pb_utils.InferenceResponse(error=error), flags=final)
        else:
            sender.send(flags=final)
