import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Calls itself with its only instance busy: shoal answers with an error, not a deadlock."""

    def execute(self, requests):
        responses = []
        for request in requests:
            inner = pb_utils.InferenceRequest(
                model_name="bls_self",
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                requested_output_names=["ERROR"],
            ).exec()
            text = inner.error().message() if inner.has_error() else "no error"
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("ERROR", np.array([text.encode()], dtype=np.object_))]
                )
            )
        return responses
