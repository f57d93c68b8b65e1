import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUT = IN * IN; IN 7 gets an error response (a step that fails midway through a stream)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if value == 7:
                error = pb_utils.TritonError("square_int32 refuses 7")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            out = pb_utils.Tensor("OUT", np.array([value * value], dtype=np.int32))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
