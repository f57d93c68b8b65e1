"""Request inputs built from NumPy arrays for the tests that serve framework models."""

from __future__ import annotations

import numpy as np
import tritonclient.http as httpclient


def http_inputs(**arrays: np.ndarray) -> list[httpclient.InferInput]:
    """One HTTP input per keyword: FP32, or BYTES for object arrays."""
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == np.object_ else "FP32"
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs
