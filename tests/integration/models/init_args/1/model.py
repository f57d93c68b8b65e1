import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        self.args["model_dir"] = pb_utils.get_model_dir()

    def execute(self, requests):
        text = json.dumps(self.args).encode()
        out = pb_utils.Tensor("ARGS", np.array([text], dtype=np.object_))
        return [pb_utils.InferenceResponse(output_tensors=[out]) for _ in requests]
