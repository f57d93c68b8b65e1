"""The inference service and the repository manager, wired by build_service, over loopback
stubs: loading a repository, inference, model control, a bad request, a stub's death."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from shoal._serve_parser import build_parser
from shoal.cli import options_from_args
from shoal.core import InferInput, InferRequest, InvalidArgument, ShoalError, Unavailable
from shoal.supervisor.compose import build_service
from shoal.supervisor.instances.loopback import Call, Loopback
from shoal.supervisor.service import InferenceService

pytestmark = pytest.mark.timeout(10)

CONFIG = """
name: "double"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def double(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    return {"Y": inputs["X"] * 2}


def repository(tmp_path, models: tuple[str, ...]) -> str:
    for name in models:
        model = tmp_path / name
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(CONFIG.replace('"double"', f'"{name}"'))
        (model / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    return str(tmp_path)


def service_for(
    tmp_path, kind: Loopback, *flags: str, models: tuple[str, ...] = ("double",)
) -> InferenceService:
    repo = repository(tmp_path, models)
    args = build_parser().parse_args(["serve", "--model-repository", repo, *flags])
    return build_service(options_from_args(args), make_stub=kind)


def request(*values: float, shape: tuple[int, ...] = (1, 2), model: str = "double") -> InferRequest:
    data = np.array(values, np.float32).tobytes()
    return InferRequest(model, inputs=[InferInput("X", "FP32", shape, data)])


async def infer(service: InferenceService, *values: float, model: str = "double") -> np.ndarray:
    response = await asyncio.wait_for(service.infer(request(*values, model=model)), 5)
    try:
        (output,) = response.outputs
        return np.array(output.as_numpy())
    finally:
        response.release()


def test_a_repository_loads_serves_and_shuts_down_leaving_nothing(tmp_path):
    async def scenario():
        kind = Loopback(lambda name: double)
        service = service_for(tmp_path, kind)
        await service.load_repository()
        assert service.is_ready()
        assert list(kind.latest) == ["double_0"]
        np.testing.assert_array_equal(await infer(service, 1.0, 2.0), [[2.0, 4.0]])
        (stats,) = service.model_statistics("double")
        assert stats.inference_count == 1 and stats.execution_count == 1
        await asyncio.sleep(0)  # releases reach the stub once per loop turn
        assert service.input_arena.used_bytes == 0
        assert kind.latest["double_0"].output_bytes_in_use == 0
        await service.shutdown(1.0)
        assert kind.latest["double_0"].returncode == 0  # finalized, then exited

    asyncio.run(scenario())


def test_explicit_model_control_loads_and_unloads(tmp_path):
    async def scenario():
        kind = Loopback(lambda name: double)
        service = service_for(tmp_path, kind, "--model-control-mode", "explicit")
        await service.load_repository()
        assert not service.model_ready("double")
        await service.load_model("double")
        assert service.model_ready("double")
        assert [(e.name, e.state) for e in service.repository_index()] == [("double", "READY")]
        await service.unload_model("double")
        assert not service.model_ready("double")
        (entry,) = service.repository_index()
        assert (entry.state, entry.reason) == ("UNAVAILABLE", "unloaded")
        await service.shutdown(1.0)

    asyncio.run(scenario())


def test_a_request_of_the_wrong_shape_names_model_and_input(tmp_path):
    async def scenario():
        service = service_for(tmp_path, Loopback(lambda name: double))
        await service.load_repository()
        with pytest.raises(InvalidArgument, match=r"'X'.*'double'|'double'.*'X'"):
            await service.infer(request(1.0, 2.0, 3.0, shape=(1, 3)))
        assert service.input_arena.used_bytes == 0
        await service.shutdown(1.0)

    asyncio.run(scenario())


def test_a_stub_that_dies_fails_its_request_and_the_model_serves_again(tmp_path):
    async def scenario():
        hang = True

        def model(inputs):
            return None if hang else double(inputs)

        kind = Loopback(lambda name: model)
        service = service_for(tmp_path, kind)
        await service.load_repository()
        pending = asyncio.ensure_future(service.infer(request(1.0, 1.0)))
        await asyncio.sleep(0.01)
        kind.latest["double_0"].kill()
        with pytest.raises(Unavailable, match="Stub process 'double_0' is not healthy"):
            await asyncio.wait_for(pending, 5)
        hang = False
        async with asyncio.timeout(5):
            while len(kind.made) < 2 or not service.model_ready("double"):
                await asyncio.sleep(0.01)
        np.testing.assert_array_equal(await infer(service, 3.0, 4.0), [[6.0, 8.0]])
        await service.shutdown(1.0)

    asyncio.run(scenario())


def test_a_bls_call_runs_the_called_model_and_gives_its_blocks_back(tmp_path):
    async def scenario():
        def model_of(instance: str):
            if instance.startswith("caller"):
                return lambda inputs: Call("double", {"X": inputs["X"] + 1})
            if instance.startswith("lost"):
                return lambda inputs: Call("missing", {"X": inputs["X"]})
            return double

        kind = Loopback(model_of)
        service = service_for(tmp_path, kind, models=("double", "caller", "lost"))
        await service.load_repository()
        np.testing.assert_array_equal(await infer(service, 1.0, 2.0, model="caller"), [[4.0, 6.0]])
        (stats,) = service.model_statistics("double")
        assert stats.inference_count == 1  # the call counts as the called model's request
        with pytest.raises(ShoalError, match="'missing'"):
            await infer(service, 1.0, 2.0, model="lost")
        await asyncio.sleep(0)
        for stub in kind.latest.values():
            assert stub.output_bytes_in_use == 0
        assert service.input_arena.used_bytes == 0
        await service.shutdown(1.0)

    asyncio.run(scenario())
