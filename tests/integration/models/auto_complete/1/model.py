import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Has no config.pbtxt: its configuration comes from auto_complete_config."""

    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(4)
        # Triton shows every field, empty lists included: models (Triton's QA ones) index them
        given = auto_complete_model_config.as_dict()
        if "X" not in [spec["name"] for spec in given["input"]]:
            auto_complete_model_config.add_input(
                {"name": "X", "data_type": "TYPE_FP32", "dims": [2]}
            )
        if "Y" not in [spec["name"] for spec in given["output"]]:
            auto_complete_model_config.add_output(
                {"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}
            )
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)]
            )
            for r in requests
        ]
