import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """ORDER counts executions; a request with a "gate" parameter waits for that file."""

    def initialize(self, args):
        self.executions = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            gate = json.loads(request.parameters()).get("gate")
            if gate:
                pb_utils.Logger.log_info(f"batch_gate: waiting for {gate}")
                deadline = time.monotonic() + 30
                while not os.path.exists(gate) and time.monotonic() < deadline:
                    time.sleep(0.005)  # the model polls its gate file
            self.executions += 1
            order = np.array([[self.executions]], np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("ORDER", order)]))
        return responses
