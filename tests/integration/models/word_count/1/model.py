import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A tokenizer's stand-in: COUNT is the number of words in TEXT."""

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()[0]
            count = np.array([len(text.split())], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("COUNT", count)]))
        return responses
