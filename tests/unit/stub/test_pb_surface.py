"""Every public name of Triton's triton_python_backend_utils exists, with Triton's values."""

from __future__ import annotations

import pytest

from shoal.stub import pb_utils

TRITON_NAMES = [
    "Tensor",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "ResponseIterator",
    "TritonError",
    "TritonModelException",
    "Logger",
    "PreferredMemory",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_MEMORY_CPU",
    "MetricFamily",
    "Metric",
    "load_model",
    "unload_model",
    "is_model_ready",
    "get_model_dir",
    "ModelConfig",
    "get_input_tensor_by_name",
    "get_output_tensor_by_name",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "using_decoupled_model_transaction_policy",
    "triton_to_numpy_type",
    "numpy_to_triton_type",
    "triton_string_to_numpy",
    "TRITON_STRING_TO_NUMPY",
    "serialize_byte_tensor",
    "deserialize_bytes_tensor",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
]

RUNTIME_HOOKS = [
    "_set_log_sink",
    "_set_model_dir",
    "_set_bls_executor",
    "_set_model_controller",
]


@pytest.mark.parametrize("name", TRITON_NAMES)
def test_public_name_exists_and_is_exported(name):
    assert hasattr(pb_utils, name)
    assert name in pb_utils.__all__


@pytest.mark.parametrize("name", RUNTIME_HOOKS)
def test_runtime_hooks_exist(name):
    assert callable(getattr(pb_utils, name))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TRITONSERVER_REQUEST_FLAG_SEQUENCE_START", 1),
        ("TRITONSERVER_REQUEST_FLAG_SEQUENCE_END", 2),
        ("TRITONSERVER_RESPONSE_COMPLETE_FINAL", 1),
        ("TRITONSERVER_REQUEST_RELEASE_ALL", 1),
        ("TRITONSERVER_REQUEST_RELEASE_RESCHEDULE", 2),
        ("TRITONSERVER_MEMORY_GPU", 0),
        ("TRITONSERVER_MEMORY_CPU", 1),
    ],
)
def test_constants_have_triton_values(name, value):
    assert getattr(pb_utils, name) == value


def test_all_lists_only_existing_names():
    for name in pb_utils.__all__:
        assert hasattr(pb_utils, name), name


def test_private_runtime_hooks_on_classes():
    assert callable(pb_utils.Tensor._wrap)
    assert callable(pb_utils.Tensor._datatype)
    assert callable(pb_utils.Tensor._array)
    assert callable(pb_utils.InferenceRequest._from_server)
    assert callable(pb_utils.InferenceResponse._error_code_name)


def test_exception_kinds():
    assert issubclass(pb_utils.TritonModelException, Exception)
    assert not issubclass(pb_utils.TritonError, BaseException)
