import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Runs each request IN times (rescheduling it in between), then answers how many runs it
    took. A negative IN returns a response for a rescheduled request: misuse, as in Triton."""

    def initialize(self, args):
        self.runs = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            wanted = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            corr = request.correlation_id()
            self.runs[corr] = self.runs.get(corr, 0) + 1
            runs = self.runs[corr]
            out = pb_utils.InferenceResponse([pb_utils.Tensor("RUNS", np.array([runs], np.int32))])
            if wanted < 0:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(out)  # should be None
            elif runs < wanted:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
            else:
                del self.runs[corr]
                responses.append(out)
        return responses
