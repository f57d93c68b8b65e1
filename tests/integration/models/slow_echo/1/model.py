import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Holds its input for SECONDS, then returns a copy: a large request that stays in flight."""

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            time.sleep(float(seconds[0]))
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out = pb_utils.Tensor("OUT", data.copy())  # in the stub's output arena
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
