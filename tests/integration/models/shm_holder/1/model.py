import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Holds its DATA input for SECONDS before it reads every byte of it: a client may change
    the memory the input came from meanwhile."""

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "DATA").as_numpy()
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            pb_utils.Logger.log_info("shm_holder: holding the input")
            time.sleep(float(seconds[0]))
            total = np.array([data.sum(dtype=np.float64)], dtype=np.float64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", total)]))
        return responses
