import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Calls add_sub through BLS twice: the second call forwards the first call's output."""

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A")
            b = pb_utils.get_input_tensor_by_name(request, "B")
            first = pb_utils.InferenceRequest(
                model_name="add_sub",
                inputs=[
                    pb_utils.Tensor("INPUT0", a.as_numpy()),
                    pb_utils.Tensor("INPUT1", b.as_numpy()),
                ],
                requested_output_names=["OUTPUT0"],
            ).exec()
            if first.has_error():
                raise pb_utils.TritonModelException(first.error().message())
            total = pb_utils.get_output_tensor_by_name(first, "OUTPUT0")
            second = pb_utils.InferenceRequest(
                model_name="add_sub",
                inputs=[
                    pb_utils.Tensor("INPUT0", total.as_numpy()),
                    pb_utils.Tensor("INPUT1", total.as_numpy()),
                ],
                requested_output_names=["OUTPUT0"],
            ).exec()
            twice = pb_utils.get_output_tensor_by_name(second, "OUTPUT0").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("SUM", np.array(total.as_numpy())),
                        pb_utils.Tensor("SUM_TWICE", twice),
                    ]
                )
            )
        return responses
