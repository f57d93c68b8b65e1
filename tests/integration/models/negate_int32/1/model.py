import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUT = -IN."""

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", -value)]))
        return responses
