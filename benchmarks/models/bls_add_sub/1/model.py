"""Benchmark model: add_sub called twice through BLS, (a, b) -> (a + b, a - b) -> (2a, 2b)."""

import triton_python_backend_utils as pb_utils


def _add_sub(first, second):
    request = pb_utils.InferenceRequest(
        model_name="add_sub",
        inputs=[pb_utils.Tensor("INPUT0", first), pb_utils.Tensor("INPUT1", second)],
        requested_output_names=["OUTPUT0", "OUTPUT1"],
    )
    response = request.exec()
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return (
        pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy(),
        pb_utils.get_output_tensor_by_name(response, "OUTPUT1").as_numpy(),
    )


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            total, difference = _add_sub(*_add_sub(a, b))
            outputs = [pb_utils.Tensor("OUTPUT0", total), pb_utils.Tensor("OUTPUT1", difference)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
