"""The pure-Python helpers of ``triton_python_backend_utils``: dtypes, BYTES, lookups."""

from __future__ import annotations

from typing import Any

import numpy as np

from shoal.ipc.dtypes import deserialize_bytes, serialize_bytes
from shoal.stub._pb_request import InferenceRequest
from shoal.stub._pb_response import InferenceResponse
from shoal.stub._pb_tensor import Tensor

#: ``TRITONSERVER_DataType`` value -> NumPy type, as Triton's ``triton_to_numpy_type`` (no BF16).
_TRITON_TO_NUMPY: dict[int, type] = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}

#: Model-config type string -> NumPy type.
TRITON_STRING_TO_NUMPY: dict[str, type] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple[()] | None:
    """Serialize an object/``bytes_`` array into Triton's length-prefixed BYTES layout.

    Returns ``()`` for an empty array and ``None`` for any other dtype (as Triton does). ``bytes``
    elements are kept; other objects become ``str(x).encode("utf-8")``.
    """
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype.kind not in ("O", "S"):
        return None
    return serialize_bytes(input_tensor)


def deserialize_bytes_tensor(encoded_tensor: bytes | bytearray | memoryview) -> np.ndarray:
    """Decode Triton's length-prefixed BYTES layout into a 1-D object array of ``bytes``.

    Raises ``shoal.ipc.dtypes.BytesFormatError`` (a ``ValueError``) for a malformed buffer.
    """
    return deserialize_bytes(memoryview(encoded_tensor).cast("B"))


def triton_to_numpy_type(data_type: int) -> type | None:
    """NumPy type of a ``TRITONSERVER_DataType`` value (``None`` for BF16 and unknown values)."""
    return _TRITON_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """``TRITONSERVER_DataType`` value of a NumPy dtype or type (``None`` if there is none)."""
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in ("O", "S"):
        return 13
    dtype = dtype.newbyteorder("=")
    for value, numpy_type in _TRITON_TO_NUMPY.items():
        if value != 13 and dtype == np.dtype(numpy_type):
            return value
    return None


def triton_string_to_numpy(triton_type_string: str) -> type:
    """NumPy type of a model-config type string (``"TYPE_FP32"`` -> ``np.float32``)."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input called ``name``, or ``None``."""
    # A request of the server's own class: its list itself, not the copy ``inputs()`` makes
    # (anything else, a model's test double say, is asked through its method as in Triton).
    if type(inference_request) is InferenceRequest:
        tensors = inference_request._inputs
    else:
        tensors = inference_request.inputs()
    for tensor in tensors:
        # The server's own tensors by their field (a method call costs ~300 instructions).
        if (tensor._name if type(tensor) is Tensor else tensor.name()) == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output called ``name``, or ``None``."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The entry of ``model_config["input"]`` called ``name``, or ``None``."""
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The entry of ``model_config["output"]`` called ``name``, or ``None``."""
    return _config_entry(model_config, "output", name)


def _config_entry(model_config: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    for entry in model_config.get(kind, ()):
        if entry.get("name") == name:
            return entry  # type: ignore[no-any-return]
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """Whether ``model_config`` sets ``model_transaction_policy { decoupled: true }``."""
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))
