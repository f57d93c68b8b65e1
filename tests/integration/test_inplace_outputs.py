"""pb_utils.empty_output_tensor: outputs built in the output arena, carried without a copy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(120)

#: OUT = 2 * IN built in place; TWICE: the same array again (copied); FREE: the arena's free
#: bytes when execute starts; KEPT: whether the array lent for the previous request still holds
#: what was written into it (the model kept it after returning it).
INPLACE = """
import numpy as np
import c_python_backend_utils
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.kept = None

    def execute(self, requests):
        free = c_python_backend_utils.shared_memory.free_memory()
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            kept = self.kept is None or bool(np.array_equal(self.kept[0], self.kept[1]))
            out = pb_utils.empty_output_tensor("OUT", x.shape, np.float32)
            array = out.as_numpy()
            np.multiply(x, 2, out=array)
            self.kept = (array, array.copy())
            responses.append(pb_utils.InferenceResponse([
                out,
                pb_utils.Tensor("TWICE", array),
                pb_utils.Tensor("FREE", np.array([free], dtype=np.int64)),
                pb_utils.Tensor("KEPT", np.array([kept])),
            ]))
        return responses
"""


def _model(repo: Path) -> None:
    (repo / "inplace" / "1").mkdir(parents=True)
    (repo / "inplace" / "1" / "model.py").write_text(INPLACE)
    (repo / "inplace" / "config.pbtxt").write_text(
        'name: "inplace"\nbackend: "python"\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] },\n'
        '         { name: "TWICE" data_type: TYPE_FP32 dims: [ -1 ] },\n'
        '         { name: "FREE" data_type: TYPE_INT64 dims: [ 1 ] },\n'
        '         { name: "KEPT" data_type: TYPE_BOOL dims: [ 1 ] } ]\n'
    )


def test_outputs_built_in_place_are_right_stable_and_given_back(tmp_path):
    _model(tmp_path)
    with ShoalServer(tmp_path) as server:
        http = httpclient.InferenceServerClient(server.url)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        free = []
        for i in range(24):
            client, module = (http, httpclient) if i % 2 else (grpc, grpcclient)
            x = np.arange(i * 1000, (i + 1) * 1000, dtype=np.float32)
            inp = module.InferInput("IN", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            result = client.infer("inplace", [inp])
            assert np.array_equal(result.as_numpy("OUT"), x * 2)
            assert np.array_equal(result.as_numpy("TWICE"), x * 2)
            assert result.as_numpy("KEPT")[0]
            free.append(int(result.as_numpy("FREE")[0]))
        # Every lent block went back once both the response and the model's array were done:
        # from the third request on, the arena is as free as it was then (the previous request's
        # array is still kept by the model, one block).
        assert len(set(free[2:])) == 1, free
        http.close()
        grpc.close()


def test_without_a_stub_the_call_gives_ordinary_memory():
    from shoal.stub import pb_utils

    tensor = pb_utils.empty_output_tensor("OUT", [2, 3], np.float32)
    assert tensor.name() == "OUT" and tensor.as_numpy().shape == (2, 3)
    assert tensor.as_numpy().flags.writeable
    with pytest.raises(pb_utils.TritonModelException, match="BYTES outputs"):
        pb_utils.empty_output_tensor("S", [1], np.object_)
