import numpy as np
import triton_python_backend_utils as pb_utils


def _value(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]


class TritonPythonModel:
    """OUT is the running sum of IN over the sequence, kept in implicit state."""

    def execute(self, requests):
        responses = []
        for position, request in enumerate(requests):
            if not _value(request, "READY"):  # a null request padding an empty slot
                responses.append(pb_utils.InferenceResponse(output_tensors=[]))
                continue
            state = pb_utils.get_input_tensor_by_name(request, "STATE_IN").as_numpy()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            total = (state + x).astype(np.int32)
            seen = [
                int(_value(request, "START")),
                int(_value(request, "END")),
                int(_value(request, "READY")),
                int(_value(request, "CORRID")),
                position,
            ]
            outputs = [
                pb_utils.Tensor("OUT", total),
                pb_utils.Tensor("STATE_OUT", total.copy()),
                pb_utils.Tensor("SEEN", np.array([seen], np.int64)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
