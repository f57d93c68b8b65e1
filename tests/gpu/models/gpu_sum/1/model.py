"""Sums BIG on the GPU, whether it arrives in CPU or GPU memory (through DLPack either way), and
says where it arrived (FORCE_CPU_ONLY_INPUT_TENSORS is "no": on the GPU when the producer's was)."""

import cupy
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            big = pb_utils.get_input_tensor_by_name(request, "BIG")
            array = cupy.from_dlpack(big) if not big.is_cpu() else cupy.asarray(big.as_numpy())
            total = float(array.sum(dtype=cupy.float64))
            out = pb_utils.Tensor("TOTAL", np.array([total], dtype=np.float64))
            where = pb_utils.Tensor("INPUT_ON_GPU", np.array([not big.is_cpu()]))
            responses.append(pb_utils.InferenceResponse([out, where]))
        return responses
