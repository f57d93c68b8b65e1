"""shoal's ``triton_python_backend_utils``: the API Triton Python models import as ``pb_utils``.

The stub runtime installs this module as ``sys.modules["triton_python_backend_utils"]``, so a
model written for Triton's Python backend runs unchanged::

    import triton_python_backend_utils as pb_utils

Every public name of Triton's module is here (see ``docs/python_models.md`` for what is supported
now and how shoal differs). The names starting with ``_`` are hooks for the stub runtime:
``Tensor._wrap``/``_datatype``/``_array``, ``InferenceRequest._from_server``,
``InferenceResponse._error_code_name``, ``_set_log_sink``, ``_set_model_dir``,
``_set_bls_executor`` and ``_set_model_controller``.
"""

from __future__ import annotations

from shoal.stub._pb_errors import TritonError, TritonModelException
from shoal.stub._pb_helpers import (
    TRITON_STRING_TO_NUMPY,
    deserialize_bytes_tensor,
    get_input_config_by_name,
    get_input_tensor_by_name,
    get_output_config_by_name,
    get_output_tensor_by_name,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
    using_decoupled_model_transaction_policy,
)
from shoal.stub._pb_logger import Logger
from shoal.stub._pb_logger import _set_log_sink as _set_log_sink
from shoal.stub._pb_model_config import ModelConfig
from shoal.stub._pb_output import _set_output_lender as _set_output_lender
from shoal.stub._pb_output import empty_output_tensor
from shoal.stub._pb_request import (
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    InferenceRequest,
    InferenceTrace,
    MemoryType,
    PreferredMemory,
)
from shoal.stub._pb_request import _set_bls_executor as _set_bls_executor
from shoal.stub._pb_request import _set_cancel_poller as _set_cancel_poller
from shoal.stub._pb_response import (
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceResponse,
    InferenceResponseSender,
    ResponseIterator,
)
from shoal.stub._pb_server import (
    Metric,
    MetricFamily,
    get_model_dir,
    is_model_ready,
    load_model,
    unload_model,
)
from shoal.stub._pb_server import _set_metrics_backend as _set_metrics_backend
from shoal.stub._pb_server import _set_model_controller as _set_model_controller
from shoal.stub._pb_server import _set_model_dir as _set_model_dir
from shoal.stub._pb_tensor import Tensor

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2

TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "Logger",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "ResponseIterator",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "empty_output_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]
