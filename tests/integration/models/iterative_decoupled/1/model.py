import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Triton's iterative-sequence example: IN responses, one per execute, counting down to 0.

    Each execute sends one response and reschedules the request until the last one.
    """

    def initialize(self, args):
        self.remaining = {}  # by correlation id: the scheduler gives each request its own

    def execute(self, requests):
        for request in requests:
            corr = request.correlation_id()
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.remaining[corr] = int(
                    pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0]
                )
            self.remaining[corr] -= 1
            left = self.remaining[corr]
            out = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([left], np.int32))])
            sender = request.get_response_sender()
            if left <= 0:
                del self.remaining[corr]
                sender.send(out, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(out)
        return None
