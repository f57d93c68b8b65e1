import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """SHAPE is the shape V has here (after the reshape); BATCH the number of requests in the
    execute call that served it. A request with a "gate" parameter waits for that file."""

    def execute(self, requests):
        for request in requests:
            gate = json.loads(request.parameters()).get("gate")
            if gate:
                pb_utils.Logger.log_info(f"batch_reshape: waiting for {gate}")
                deadline = time.monotonic() + 30
                while not os.path.exists(gate) and time.monotonic() < deadline:
                    time.sleep(0.005)  # the model polls its gate file
        responses = []
        for request in requests:
            v = pb_utils.get_input_tensor_by_name(request, "V").as_numpy()
            rows = v.shape[0]
            outputs = [
                pb_utils.Tensor("SHAPE", np.tile(np.array(v.shape, np.int64), (rows, 1))),
                pb_utils.Tensor("BATCH", np.full((rows, 1), len(requests), np.int32)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
