import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sends COUNT responses of SIZE bytes from a thread, as fast as it can, until the request
    is cancelled or all are out; then the final flag alone."""

    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            size = int(pb_utils.get_input_tensor_by_name(request, "SIZE").as_numpy()[0])
            threading.Thread(target=self._send, args=(request, count, size)).start()
        return None

    def _send(self, request, count, size):
        sender = request.get_response_sender()
        blob = np.zeros(max(size, 4), dtype=np.uint8)
        for index in range(count):
            if index % 256 == 0 and request.is_cancelled():
                break
            blob[:4] = np.frombuffer(np.int32(index).tobytes(), dtype=np.uint8)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("BLOB", blob)]))
        pb_utils.Logger.log_info(f"decoupled_blob: cancelled={request.is_cancelled()}")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
