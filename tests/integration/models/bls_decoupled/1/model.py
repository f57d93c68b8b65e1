import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Streams decoupled_repeat through BLS and sums the indices it sent."""

    async def execute(self, requests):
        responses = []
        for request in requests:
            count = pb_utils.get_input_tensor_by_name(request, "COUNT")
            stream = await pb_utils.InferenceRequest(
                model_name="decoupled_repeat",
                inputs=[pb_utils.Tensor("COUNT", count.as_numpy())],
                requested_output_names=["INDEX"],
            ).async_exec(decoupled=True)
            total = 0
            for response in stream:
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                index = pb_utils.get_output_tensor_by_name(response, "INDEX")
                if index is not None:
                    total += int(index.as_numpy()[0])
            out = pb_utils.Tensor("TOTAL", np.array([total], dtype=np.int32))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
