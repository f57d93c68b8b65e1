"""OUT = STATE_OUT = STATE_IN + IN, computed on the GPU; STATE_OUT leaves as a CUDA tensor."""

import cupy
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.device = int(args["model_instance_device_id"])

    def execute(self, requests):
        responses = []
        for request in requests:
            state = pb_utils.get_input_tensor_by_name(request, "STATE_IN").as_numpy()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            with cupy.cuda.Device(self.device):
                total = cupy.asarray(state) + cupy.asarray(x)
            outputs = [
                pb_utils.Tensor("OUT", cupy.asnumpy(total)),
                pb_utils.Tensor.from_dlpack("STATE_OUT", total),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
