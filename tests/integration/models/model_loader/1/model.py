import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Loads a model, checks it, unloads it: pb_utils model control from inside a model."""

    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "NAME").as_numpy()[0].decode()
            before = pb_utils.is_model_ready(name)
            pb_utils.load_model(model_name=name)
            loaded = pb_utils.is_model_ready(name)
            pb_utils.unload_model(name)
            after = pb_utils.is_model_ready(name)
            states = np.array([str(s).encode() for s in (before, loaded, after)], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("STATES", states)]))
        return responses
