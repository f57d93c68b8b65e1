import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Per request: OUT = the state it got, then OUT = STATE_OUT = state + IN, then the final
    flag alone. The responses come from a thread after execute returned, a little later, so a
    sequence's next request is only right if the server waits for this one's final flag."""

    def execute(self, requests):
        for request in requests:
            state = pb_utils.get_input_tensor_by_name(request, "STATE_IN").as_numpy().copy()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
            sender = request.get_response_sender()
            threading.Thread(target=self._send, args=(sender, state, x)).start()
        return None

    def _send(self, sender, state, x):
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", state)]))
        time.sleep(0.05)  # the model is still working on this request
        total = (state + x).astype(np.int32)
        outputs = [pb_utils.Tensor("OUT", total), pb_utils.Tensor("STATE_OUT", total.copy())]
        sender.send(pb_utils.InferenceResponse(outputs))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
