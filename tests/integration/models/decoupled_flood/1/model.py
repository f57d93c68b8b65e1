import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sends INDEX = 0.. from a thread, as fast as it can, until the request is cancelled or
    COUNT responses are out; then the final flag alone."""

    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            threading.Thread(target=self._send, args=(request, count)).start()
        return None

    def _send(self, request, count):
        sender = request.get_response_sender()
        for index in range(count):
            if index % 256 == 0 and request.is_cancelled():
                break
            out = pb_utils.Tensor("INDEX", np.array([index], dtype=np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
        pb_utils.Logger.log_info(f"decoupled_flood: cancelled={request.is_cancelled()}")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
