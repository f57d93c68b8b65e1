import threading

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Hangs forever in execute when HANG is non-zero."""

    def execute(self, requests):
        responses = []
        for request in requests:
            hang = pb_utils.get_input_tensor_by_name(request, "HANG").as_numpy()
            if hang[0]:
                threading.Event().wait()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OK", hang.copy())]))
        return responses
