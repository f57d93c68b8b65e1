import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A_OUT = A and B_OUT = B, each only where its input was given."""

    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for name in ("A", "B"):
                given = pb_utils.get_input_tensor_by_name(request, name)
                if given is not None:
                    outputs.append(pb_utils.Tensor(name + "_OUT", given.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
