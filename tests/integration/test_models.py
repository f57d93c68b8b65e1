"""Triton model semantics: initialize args, sibling imports, logging."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tritonclient.http as httpclient

from shoal.ipc.cuda import cuda_device_count
from tests.integration.server import TEST_MODELS

pytestmark = pytest.mark.timeout(120)


def test_initialize_args(test_client):
    inp = httpclient.InferInput("IN", [1], "FP32")
    inp.set_data_from_numpy(np.ones(1, dtype=np.float32))
    result = test_client.infer("init_args", [inp])
    args = json.loads(result.as_numpy("ARGS")[0])
    assert args["model_name"] == "init_args"
    assert args["model_version"] == "1"
    # No instance_group: KIND_AUTO, which is KIND_GPU on a machine with a GPU (as in Triton).
    assert args["model_instance_kind"] == ("GPU" if cuda_device_count() else "CPU")
    assert (
        args["model_instance_name"] == "init_args_0"
    )  # no instance_group: one group named after the model
    assert args["model_instance_device_id"] == "0"
    assert os.path.samefile(args["model_repository"], TEST_MODELS / "init_args")
    assert os.path.samefile(args["model_dir"], TEST_MODELS / "init_args" / "1")
    config = json.loads(args["model_config"])
    assert config["name"] == "init_args"
    assert config["parameters"]["greeting"]["string_value"] == "hello"
    assert config["output"][0]["data_type"] == "TYPE_STRING"


def test_sibling_imports(test_client):
    inp = httpclient.InferInput("IN", [2], "FP32")
    inp.set_data_from_numpy(np.array([1, 2], dtype=np.float32))
    result = test_client.infer("multi_file", [inp])
    np.testing.assert_array_equal(result.as_numpy("OUT"), [3, 5])


def test_default_mode_response_sender(test_client):
    inp = httpclient.InferInput("IN", [2], "FP32")
    inp.set_data_from_numpy(np.array([1, 2], dtype=np.float32))
    result = test_client.infer("sender_default", [inp])
    np.testing.assert_array_equal(result.as_numpy("OUT"), [10, 20])


def test_execute_returning_a_non_list_fails_with_tritons_message(test_client):
    from tritonclient.utils import InferenceServerException

    inp = httpclient.InferInput("IN", [1], "FP32")
    inp.set_data_from_numpy(np.array([1], dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        test_client.infer("bad_return", [inp])
    assert "Expected a list in the execute return, found type 'str'." in str(info.value)
    assert test_client.is_model_ready("bad_return")


def test_auto_complete_config_fills_the_configuration(test_client):
    config = test_client.get_model_config("auto_complete")
    assert config["max_batch_size"] == 4
    assert config["input"][0]["name"] == "X" and config["input"][0]["dims"] == [2]
    assert config["output"][0]["data_type"] == "TYPE_FP32"
    assert "dynamic_batching" in config
    inp = httpclient.InferInput("X", [1, 2], "FP32")
    inp.set_data_from_numpy(np.array([[1, 2]], dtype=np.float32))
    result = test_client.infer("auto_complete", [inp])
    np.testing.assert_array_equal(result.as_numpy("Y"), [[2, 3]])
