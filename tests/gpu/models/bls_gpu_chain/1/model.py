"""gpu_make then gpu_sum through BLS, asking for the big tensor in GPU memory, and handing it on
to gpu_sum as it came (through DLPack)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.device = int(args["model_instance_device_id"])

    def execute(self, requests):
        responses = []
        for request in requests:
            made = pb_utils.InferenceRequest(
                model_name="gpu_make",
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "FILL"),
                    pb_utils.get_input_tensor_by_name(request, "COUNT"),
                ],
                requested_output_names=["BIG"],
                preferred_memory=pb_utils.PreferredMemory(
                    pb_utils.TRITONSERVER_MEMORY_GPU, self.device
                ),
            ).exec()
            if made.has_error():
                raise pb_utils.TritonModelException(made.error().message())
            big = pb_utils.get_output_tensor_by_name(made, "BIG")
            on_gpu = not big.is_cpu()
            summed = pb_utils.InferenceRequest(
                model_name="gpu_sum",
                inputs=[pb_utils.Tensor.from_dlpack("BIG", big.to_dlpack())],
                requested_output_names=["TOTAL", "INPUT_ON_GPU"],
            ).exec()
            if summed.has_error():
                raise pb_utils.TritonModelException(summed.error().message())
            total = pb_utils.get_output_tensor_by_name(summed, "TOTAL")
            flag = pb_utils.Tensor("ON_GPU", np.array([on_gpu]))
            where = pb_utils.get_output_tensor_by_name(summed, "INPUT_ON_GPU")
            where = pb_utils.Tensor("SUM_INPUT_ON_GPU", where.as_numpy())
            responses.append(pb_utils.InferenceResponse([total, flag, where]))
        return responses
