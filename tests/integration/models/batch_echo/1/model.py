import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

_THREADS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class TritonPythonModel:
    """Echoes IN; BATCH is the number of requests in the execute call that served it."""

    def execute(self, requests):
        time.sleep(0.005)  # a little work, so that concurrent requests queue up
        threads = np.array([os.environ.get(name, "").encode() for name in _THREADS], np.object_)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            rows = x.shape[0]
            batch = np.full((rows, 1), len(requests), np.int32)
            outputs = [
                pb_utils.Tensor("OUT", x.copy()),
                pb_utils.Tensor("BATCH", batch),
                pb_utils.Tensor("THREADS", np.tile(threads, (rows, 1))),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
