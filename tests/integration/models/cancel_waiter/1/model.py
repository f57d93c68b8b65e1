import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Runs until its request is cancelled (30 s at most), then says so in the log."""

    def execute(self, requests):
        responses = []
        for request in requests:
            pb_utils.Logger.log_info(f"cancel_waiter: started id={request.request_id()}")
            deadline = time.monotonic() + 30
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.005)  # a model's work loop, checking for cancellation
            cancelled = request.is_cancelled()
            pb_utils.Logger.log_info(f"cancel_waiter: cancelled={cancelled}")
            if cancelled:
                error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                out = pb_utils.Tensor("OUT", np.array([1], dtype=np.int32))
                responses.append(pb_utils.InferenceResponse([out]))
        return responses
