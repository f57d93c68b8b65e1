"""Sums BIG with NumPy: with FORCE_CPU_ONLY_INPUT_TENSORS left at "yes" (Triton's default), an
input a GPU model produced arrives in CPU memory."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            big = pb_utils.get_input_tensor_by_name(request, "BIG")
            if not big.is_cpu():
                raise pb_utils.TritonModelException("BIG should have been copied to the CPU")
            total = float(big.as_numpy().sum(dtype=np.float64))
            out = pb_utils.Tensor("TOTAL", np.array([total], dtype=np.float64))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
