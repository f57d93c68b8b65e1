"""Sends a CUDA tensor to gpu_sum by BLS (its pool block is lent to this stub until the call's
response is dropped), then dies while holding that response: the supervisor must take the
block back."""

import os

import cupy
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.device = int(args["model_instance_device_id"])

    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            with cupy.cuda.Device(self.device):
                big = cupy.ones(count, dtype=cupy.float32)
            summed = pb_utils.InferenceRequest(
                model_name="gpu_sum",
                inputs=[pb_utils.Tensor.from_dlpack("BIG", big)],
                requested_output_names=["TOTAL"],
            ).exec()
            if summed.has_error():
                raise pb_utils.TritonModelException(summed.error().message())
            os._exit(3)  # with the BLS input block lent and the response held
