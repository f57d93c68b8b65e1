import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Fans out four BLS calls with async_exec and reports the target's peak concurrency."""

    async def execute(self, requests):
        responses = []
        for request in requests:
            calls = [
                pb_utils.InferenceRequest(
                    model_name="async_peak",
                    inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                    requested_output_names=["PEAK"],
                ).async_exec()
                for _ in range(4)
            ]
            results = await asyncio.gather(*calls)
            peak = 0
            for result in results:
                if result.has_error():
                    raise pb_utils.TritonModelException(result.error().message())
                peak = max(
                    peak, int(pb_utils.get_output_tensor_by_name(result, "PEAK").as_numpy()[0])
                )
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("PEAK", np.array([peak], dtype=np.int32))]
                )
            )
        return responses
