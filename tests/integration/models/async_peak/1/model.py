import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Records how many of its executes ran at the same time inside this one instance
    (config.pbtxt opts into concurrent executes with async_execute_concurrency)."""

    def initialize(self, args):
        self.running = 0
        self.peak = 0

    async def execute(self, requests):
        self.running += 1
        self.peak = max(self.peak, self.running)
        # Give the other executes a chance to start; the peak, not the time, is the result.
        for _ in range(50):
            await asyncio.sleep(0.005)
            if self.peak > 1:
                break
        self.running -= 1
        peak = pb_utils.Tensor("PEAK", np.array([self.peak], dtype=np.int32))
        return [pb_utils.InferenceResponse([peak]) for _ in requests]
