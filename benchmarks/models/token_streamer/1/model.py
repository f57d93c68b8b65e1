"""Benchmark model: a decoupled token streamer (COUNT responses, then the final flag alone)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            for index in range(count):
                token = pb_utils.Tensor("TOKEN", np.array([index], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([token]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
