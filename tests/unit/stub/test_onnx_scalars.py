"""Rank-0 (scalar) tensors of ONNX graphs, as Triton's onnxruntime backend serves them.

A model without batching may configure a scalar with any dims of ones (``[1]``, ``[1,1]``): the
request's one element is fed as the scalar and the scalar output comes back in the configured
dims; other dims fail the load with Triton's words. The graph here is Triton's QA scalar model
(``qa/common/gen_qa_ort_scalar_models.py``): an Identity whose tensors have no shape at all,
which onnxruntime reports as rank 0. Skipped when onnx or onnxruntime is missing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from shoal.stub.backends._onnx_io import OnnxModelError  # noqa: E402
from shoal.stub.backends.onnxruntime import OnnxRuntimeModel  # noqa: E402
from tests.unit.stub.helpers import config_tensor as tensor  # noqa: E402
from tests.unit.stub.helpers import instance_args, server_request  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def identity_without_shapes(path: Path) -> Path:
    nodes = [helper.make_node("Identity", ["INPUT"], ["OUTPUT"])]
    inputs = [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, None)]
    outputs = [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "scalar", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def load(path: Path, dims: list[int]) -> OnnxRuntimeModel:
    config = {
        "name": "onnx_scalar",
        "backend": "onnxruntime",
        "input": [tensor("INPUT", "TYPE_FP32", dims)],
        "output": [tensor("OUTPUT", "TYPE_FP32", dims)],
    }
    model = OnnxRuntimeModel(str(path))
    model.initialize(instance_args(config))
    return model


@pytest.mark.parametrize("dims", [[1], [1, 1], [1, 1, 1]])
def test_a_scalar_configured_with_ones_answers_in_its_dims(tmp_path, dims):
    model = load(identity_without_shapes(tmp_path / "1" / "model.onnx"), dims)
    value = np.full(dims, 2.5, np.float32)
    (response,) = model.execute([server_request({"INPUT": value})])
    assert not response.has_error(), response.error().message()
    (output,) = response.output_tensors()
    assert output.as_numpy().shape == tuple(dims)
    assert output.as_numpy().reshape(-1)[0] == 2.5


def test_a_scalar_configured_with_more_than_one_element_fails_the_load(tmp_path):
    path = identity_without_shapes(tmp_path / "1" / "model.onnx")
    with pytest.raises(OnnxModelError) as failure:
        load(path, [2])
    assert str(failure.value) == (
        "unable to load model 'onnx_scalar', scalar tensor 'INPUT', should only provide 1 in "
        "the model configuration when the model doesn't support batching. Model configuration "
        "provided: [2]."
    )
