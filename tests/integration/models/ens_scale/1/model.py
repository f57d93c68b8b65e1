import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.factor = float(
            json.loads(args["model_config"])["parameters"]["factor"]["string_value"]
        )

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [
                    pb_utils.Tensor(
                        "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * self.factor
                    )
                ]
            )
            for r in requests
        ]
