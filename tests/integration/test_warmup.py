"""model_warmup: every instance runs the configured samples before its model is ready."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(120)

#: Records every request it runs; OUT answers with what this instance saw before.
RECORDER = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = []

    def execute(self, requests):
        responses = []
        for request in requests:
            record = {}
            for name in ("F", "S"):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is None:
                    continue
                array = tensor.as_numpy()
                if array.dtype == np.object_:
                    values = [bytes(v).decode() for v in array.flat]
                else:
                    values = array.astype(np.float64).ravel().tolist()
                record[name] = {"shape": list(array.shape), "values": values}
            record["id"] = request.request_id()
            seen = json.dumps(self.seen)
            self.seen.append(record)
            out = pb_utils.Tensor("OUT", np.array([seen.encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""

FAILING = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            if request.request_id().startswith("warmup"):
                error = pb_utils.TritonError("not ready for " + request.request_id())
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                responses.append(pb_utils.InferenceResponse([]))
        return responses
"""

IO = (
    'input [ { name: "F" data_type: TYPE_FP32 dims: [ 4 ] optional: true },\n'
    '        { name: "S" data_type: TYPE_STRING dims: [ 2 ] optional: true } ]\n'
    'output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
)


def _model(repo: Path, name: str, source: str, config: str) -> Path:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(source)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}')
    return repo / name


def _recorder(repo: Path) -> None:
    model = _model(
        repo,
        "warm",
        RECORDER,
        "max_batch_size: 4\n" + IO + "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
        "model_warmup [\n"
        '  { name: "zeros" batch_size: 2 count: 3 inputs {\n'
        '      key: "F" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }\n'
        '    inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } } },\n'
        '  { name: "random" batch_size: 1 inputs {\n'
        '      key: "F" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } },\n'
        '  { name: "file" batch_size: 3 inputs {\n'
        '      key: "F" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "f.bin" } }\n'
        '    inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ]'
        ' input_data_file: "s.bin" } } }\n'
        "]\n",
    )
    (model / "warmup").mkdir()
    np.arange(4, dtype=np.float32).tofile(model / "warmup" / "f.bin")
    strings = b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b"xyz"))
    (model / "warmup" / "s.bin").write_bytes(strings)


def test_every_instance_runs_every_sample_before_the_model_is_ready(tmp_path):
    _recorder(tmp_path)
    with ShoalServer(tmp_path) as server:
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_model_ready("warm")
        data = np.ones((1, 4), dtype=np.float32)
        inp = httpclient.InferInput("F", [1, 4], "FP32")
        inp.set_data_from_numpy(data)
        seen = json.loads(client.infer("warm", [inp]).as_numpy("OUT")[0])
        # In config order, 'count' times each (0 means once); batch_size repeats the data.
        assert [r["id"] for r in seen] == ["warmup zeros"] * 3 + ["warmup random", "warmup file"]
        for record in seen[:3]:
            assert record["F"] == {"shape": [2, 4], "values": [0.0] * 8}
            assert record["S"] == {"shape": [2, 2], "values": [""] * 4}
        random = seen[3]["F"]
        assert random["shape"] == [1, 4] and "S" not in seen[3]
        assert all(0.0 <= v < 1.0 for v in random["values"]) and len(set(random["values"])) > 1
        assert seen[4]["F"] == {"shape": [3, 4], "values": [0.0, 1.0, 2.0, 3.0] * 3}
        assert seen[4]["S"] == {"shape": [3, 2], "values": ["ab", "xyz"] * 3}
        # Each of the two instances ran the samples (Triton's log line), none counted.
        runs = re.findall(
            r"model 'warm' instance (warm_0_\d) is running warmup sample '(\w+)'", server.output
        )
        assert sorted(set(runs)) == [
            (f"warm_0_{i}", s) for i in (0, 1) for s in ("file", "random", "zeros")
        ]
        assert len(runs) == 2 * 5
        stats = client.get_inference_statistics("warm")["model_stats"][0]
        assert stats["inference_count"] == 1 and stats["execution_count"] == 1
        client.close()


def test_a_failing_sample_fails_the_load_naming_model_and_sample(tmp_path):
    _model(
        tmp_path,
        "cold",
        FAILING,
        IO + 'model_warmup [ { name: "first" batch_size: 1 inputs {\n'
        '  key: "F" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]\n',
    )
    missing = _model(
        tmp_path,
        "no_file",
        FAILING,
        IO + 'model_warmup [ { name: "from_disk" batch_size: 1 inputs {\n'
        '  key: "F" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "nope" } } } ]\n',
    )
    (missing / "warmup").mkdir()
    short = _model(
        tmp_path,
        "short_file",
        FAILING,
        IO + 'model_warmup [ { name: "short" batch_size: 1 inputs {\n'
        '  key: "F" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "f" } } } ]\n',
    )
    (short / "warmup").mkdir()
    (short / "warmup" / "f").write_bytes(bytes(10))
    args = ("--model-control-mode", "explicit")
    with ShoalServer(tmp_path, extra_args=args) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("cold")
        text = str(failed.value)
        # Triton's words (L0_warmup greps for them), then the instance.
        assert "failed to run warmup sample 'first': not ready for warmup first; " in text
        assert "(instance 'cold_0' of model 'cold')" in text
        assert not client.is_model_ready("cold")
        with pytest.raises(InferenceServerException, match="input_data_file 'nope'"):
            client.load_model("no_file")
        with pytest.raises(
            InferenceServerException,
            match="warmup sample 'short' of model 'short_file' needs 16 bytes, but "
            "input_data_file 'f' has only 10",
        ):
            client.load_model("short_file")
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert {index[n].state for n in ("cold", "no_file", "short_file")} == {"UNAVAILABLE"}
        client.close()
