import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sends COUNT responses (INDEX = 0..COUNT-1) from a thread, then the final flag alone."""

    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            threading.Thread(target=self._send, args=(sender, count)).start()
        return None

    def _send(self, sender, count):
        for index in range(count):
            out = pb_utils.Tensor("INDEX", np.array([index], dtype=np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
