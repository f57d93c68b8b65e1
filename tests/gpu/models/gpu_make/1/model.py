"""Makes a CUDA tensor of COUNT copies of FILL and returns it through DLPack (a GPU output)."""

import cupy
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.device = int(args["model_instance_device_id"])

    def execute(self, requests):
        responses = []
        for request in requests:
            fill = float(pb_utils.get_input_tensor_by_name(request, "FILL").as_numpy()[0])
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            with cupy.cuda.Device(self.device):
                big = cupy.full(count, fill, dtype=cupy.float32)
            tensor = pb_utils.Tensor.from_dlpack("BIG", big)
            assert not tensor.is_cpu()
            responses.append(pb_utils.InferenceResponse([tensor]))
        return responses
