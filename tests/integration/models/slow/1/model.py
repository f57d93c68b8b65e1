import sys
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        print("slow: hello from stdout")
        print("slow: hello from stderr", file=sys.stderr)

    def execute(self, requests):
        responses = []
        for request in requests:
            pb_utils.Logger.log_info("slow: executing")
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            time.sleep(float(seconds[0]))
            out = pb_utils.Tensor("SECONDS_OUT", seconds.copy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("slow: finalize called")
