import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        error = pb_utils.TritonError("rejected by the model", pb_utils.TritonError.INVALID_ARG)
        return [pb_utils.InferenceResponse(error=error) for _ in requests]
