import numpy as np
import triton_python_backend_utils as pb_utils


def _input(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    """OUT is the running sum of IN; a batch never holds two requests of one sequence."""

    def execute(self, requests):
        ids = [_input(r, "CORRID").reshape(-1)[0] for r in requests]
        if len(set(ids)) != len(ids):
            raise pb_utils.TritonModelException(f"two requests of one sequence in a batch: {ids}")
        responses = []
        for request, corrid in zip(requests, ids, strict=True):
            total = (_input(request, "STATE_IN") + _input(request, "IN")).astype(np.int32)
            outputs = [
                pb_utils.Tensor("OUT", total),
                pb_utils.Tensor("STATE_OUT", total.copy()),
                pb_utils.Tensor("CORRID_SEEN", np.array([[corrid]], np.object_)),
                pb_utils.Tensor("START_SEEN", _input(request, "START").astype(np.float32)),
                pb_utils.Tensor("BATCH", np.array([[len(requests)]], np.int32)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
