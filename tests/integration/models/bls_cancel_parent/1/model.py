import asyncio
import time

import numpy as np
import triton_python_backend_utils as pb_utils

EXEC, STREAM, ITERATOR_CANCEL, ASYNC_EXEC = 0, 1, 2, 3


def _waiter(request_id):
    return pb_utils.InferenceRequest(
        request_id=request_id,
        model_name="cancel_waiter",
        inputs=[pb_utils.Tensor("IN", np.array([0], dtype=np.int32))],
        requested_output_names=["OUT"],
    )


def _ticker():
    return pb_utils.InferenceRequest(
        model_name="decoupled_until_cancel",
        inputs=[pb_utils.Tensor("IN", np.array([0], dtype=np.int32))],
        requested_output_names=["TICK"],
    )


async def _async_wait(request_id):
    return await _waiter(request_id).async_exec()


def _cancelled(response):
    error = response.error()
    return error is not None and error.code() == pb_utils.TritonError.CANCELLED


class TritonPythonModel:
    """Calls a child model through BLS in one of four ways and logs how the call ended.

    EXEC, STREAM and ASYNC_EXEC wait until the client cancels this request; ITERATOR_CANCEL
    cancels its own decoupled call after three responses.
    """

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
        started = time.monotonic()
        count, cancelled = 0, False
        pb_utils.Logger.log_info(f"bls_cancel_parent: calling mode={mode}")
        if mode == EXEC:
            cancelled = _cancelled(_waiter(request.request_id()).exec())
        elif mode == ASYNC_EXEC:
            cancelled = _cancelled(asyncio.run(_async_wait(request.request_id())))
        else:
            responses = _ticker().exec(decoupled=True)
            for response in responses:
                if count == 0:
                    pb_utils.Logger.log_info("bls_cancel_parent: streaming")
                cancelled = cancelled or _cancelled(response)
                count += 1
                if mode == ITERATOR_CANCEL and count == 3:
                    responses.cancel()
        seconds = time.monotonic() - started
        pb_utils.Logger.log_info(
            f"bls_cancel_parent: mode={mode} cancelled={cancelled} count={count} "
            f"parent_cancelled={request.is_cancelled()} seconds={seconds:.1f}"
        )
        out = pb_utils.Tensor("COUNT", np.array([count], dtype=np.int32))
        return pb_utils.InferenceResponse([out])
