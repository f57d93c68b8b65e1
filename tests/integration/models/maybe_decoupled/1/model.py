import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _tick(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("TICK", np.array([value], np.int32))])


class TritonPythonModel:
    """Not decoupled: one answer (TICK 0). Decoupled: ticks every 10 ms from a thread until
    the request is cancelled (30 s at most), then the final flag alone."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)

    def execute(self, requests):
        if not self.decoupled:
            return [_tick(0) for _ in requests]
        for request in requests:
            threading.Thread(target=self._ticks, args=(request,)).start()
        return None

    def _ticks(self, request):
        sender = request.get_response_sender()
        deadline = time.monotonic() + 30
        tick = 0
        while not request.is_cancelled() and time.monotonic() < deadline:
            sender.send(_tick(tick))
            tick += 1
            time.sleep(0.01)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
