import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers through the response sender in default (non-decoupled) mode, as Triton allows."""

    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 10)])
            request.get_response_sender().send(
                response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
        return None if len(requests) == 0 else [None] * len(requests)
