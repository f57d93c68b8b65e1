import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUT = IN + 1, once the file named by the request's "gate" parameter exists; the file
    named by "started" is made first, so that a test knows the request is executing, and the
    one named by "cancelled" once the model sees the request cancelled (it still waits for the
    gate, then answers). With "crash", the stub exits at the gate instead."""

    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if params.get("started"):
                open(params["started"], "a").close()
            gate = params.get("gate")
            deadline = time.monotonic() + 60
            seen = params.get("cancelled")
            while gate and not os.path.exists(gate) and time.monotonic() < deadline:
                if seen and request.is_cancelled():
                    open(seen, "a").close()
                    seen = None
                time.sleep(0.005)  # the model polls its gate file
            if params.get("crash"):
                os._exit(3)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data + 1)]))
        return responses
