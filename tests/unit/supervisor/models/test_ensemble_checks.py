"""Load-time ensemble checks against step models (shoal/supervisor/models/_ensemble_checks.py),
with the integration test models' configurations."""

from __future__ import annotations

import pytest

from shoal.config import load_model_config
from shoal.supervisor.models._ensemble_checks import (
    EnsembleProblem,
    check_ensemble,
    decoupled_flow,
)
from shoal.supervisor.models._step_models import ensemble_decoupled, ensemble_problem
from shoal.supervisor.models.repository import ModelSource
from tests.integration.server import BUNDLED, TEST_MODELS
from tests.unit.config.helpers import make_model

pytestmark = pytest.mark.timeout(30)


def _config(name):
    for repo in (TEST_MODELS, BUNDLED):
        if (repo / name).is_dir():
            return load_model_config(repo / name)
    return None


def _check(name):
    configs = {}

    def config_of(model):
        if model not in configs:
            configs[model] = _config(model)
        return configs[model]

    def steps_of(model):
        config = config_of(model)
        return [s.model_name for s in config.ensemble_steps] if config else []

    check_ensemble(config_of(name), lambda m: config_of(m) is not None, config_of, steps_of)


def test_a_nested_ensemble_is_checked_like_a_model():
    _check("ens_nested")
    _check("ens_diamond")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("ens_cycle_a", "ensemble 'ens_cycle_a' contains itself ('ens_cycle_a' -> 'ens_cycle_b'"),
        # Triton's words (L0_model_config's circular_dependency)
        (
            "ens_cycle_a",
            "circular dependency between ensembles: ens_cycle_a -> ... -> ens_cycle_b -> "
            "ens_cycle_a",
        ),
        ("ens_bad_shape", "tensor 'X' has shape [3] but 'X' of model 'ens_diamond' has shape [4]"),
        ("ens_bad_dtype", "tensor 'X' is INT32 but 'INPUT0' of model 'add_sub' is FP32"),
        ("ens_inner_unknown", "uses model 'no_such_model', which is in no model repository"),
    ],
)
def test_problems_name_the_ensemble_and_the_tensor(name, message):
    with pytest.raises(EnsembleProblem) as info:
        _check(name)
    assert message in str(info.value)


PRODUCER = """
    name: "producer"
    backend: "python"
    max_batch_size: 8
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""
CONSUMER = """
    name: "consumer"
    backend: "python"
    max_batch_size: 4
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
CHAIN = """
    name: "chain"
    platform: "ensemble"
    max_batch_size: {batch}
    input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
    output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
    ensemble_scheduling {{ step [
      {{ model_name: "producer" model_version: -1
         input_map {{ key: "IN" value: "X" }} output_map {{ key: "OUT" value: "T" }} }},
      {{ model_name: "consumer" model_version: -1
         input_map {{ key: "IN" value: "T" }} output_map {{ key: "OUT" value: "Y" }} }}
    ] }}
"""


def _chain(tmp_path, batch):
    configs = {
        name: load_model_config(make_model(tmp_path, name, text, model_file=model_file))
        for name, text, model_file in (
            ("producer", PRODUCER, "model.py"),
            ("consumer", CONSUMER, "model.py"),
            ("chain", CHAIN.format(batch=batch), None),
        )
    }
    check_ensemble(configs["chain"], configs.__contains__, configs.get, lambda _: [])


def test_an_intermediate_tensor_is_checked_between_step_models(tmp_path):
    with pytest.raises(EnsembleProblem) as info:
        _chain(tmp_path, 4)
    assert str(info.value) == (
        "ensemble 'chain' tensor 'T' is INT32 but 'IN' of model 'consumer' is FP32 "
        "(the tensor comes from 'OUT' of model 'producer')"
    )


def test_a_step_model_must_batch_as_much_as_the_ensemble(tmp_path):
    with pytest.raises(EnsembleProblem) as info:
        _chain(tmp_path, 16)
    assert "ensemble 'chain' allows batch size 16 but model 'producer'" in str(info.value)


def _ensemble(name, step):
    return (
        f'name: "{name}"\nplatform: "ensemble"\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f'ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1 '
        'input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }\n'
    )


def test_a_cycle_through_a_custom_config_is_found_with_model_config_name(tmp_path):
    """--model-config-name: the steps of an ensemble not loaded yet are read from the file the
    server would load it from (configs/<name>.pbtxt where it exists)."""
    for name, step in (("ens_a", "ens_b"), ("ens_b", "other")):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(_ensemble(name, step))
    (tmp_path / "ens_b" / "configs").mkdir()
    (tmp_path / "ens_b" / "configs" / "alt.pbtxt").write_text(_ensemble("ens_b", "ens_a"))
    sources = {n: ModelSource(n, str(tmp_path / n)) for n in ("ens_a", "ens_b", "other")}
    config = load_model_config(tmp_path / "ens_a")
    assert ensemble_problem(config, sources, {}) is None
    problem = ensemble_problem(config, sources, {}, "alt")
    assert problem is not None and "ensemble 'ens_a' contains itself" in problem, problem


def _sources():
    dirs = [p for repo in (TEST_MODELS, BUNDLED) for p in repo.iterdir() if p.is_dir()]
    return {p.name: ModelSource(p.name, str(p)) for p in dirs}


@pytest.mark.parametrize(
    ("name", "decoupled"),
    [("ens_stream", True), ("ens_stream_nested", True), ("ens_diamond", False)],
)
def test_an_ensemble_is_decoupled_when_a_step_is(name, decoupled):
    """Triton's rule, read from the repository while the step models are not loaded (a nested
    ensemble is decoupled through its own steps)."""
    config = _config(name)
    assert ensemble_problem(config, _sources(), {}) is None
    assert ensemble_decoupled(config, _sources(), {}) is decoupled


MIXED = """
name: "mixed"
platform: "ensemble"
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "Z" data_type: TYPE_INT32 dims: [ 1 ] }}
]
ensemble_scheduling {{ step [
  {{ model_name: "rep" model_version: -1
    input_map {{ key: "IN" value: "X" }} output_map {{ key: "OUT" value: "T" }} }},
  {{ model_name: "{second}" model_version: -1
    input_map [ {{ key: "A" value: "T" }}, {{ key: "B" value: "X" }} ]
    output_map {{ key: "OUT" value: "Y" }} }},
  {{ model_name: "plain" model_version: -1
    input_map {{ key: "IN" value: "X" }} output_map {{ key: "OUT" value: "Z" }} }}
] }}
"""


@pytest.mark.parametrize(
    ("decoupled", "message"),
    [
        ({"rep"}, "in ensemble 'mixed', step 1 of model 'mix' receives inputs originated from "),
        ({"rep", "mix"}, "step 1 of model 'mix' receives inputs originated from different"),
        ({"plain", "mix"}, "in ensemble 'mixed', its outputs receive inputs originated from"),
        # Triton's words (L0_model_config's invalid_decoupled_branching and _2)
        ({"rep"}, "in ensemble mixed, step of model 'mix' receives inputs originated from "),
        ({"plain", "mix"}, "in ensemble mixed, step of model 'mixed' receives inputs originated"),
    ],
)
def test_a_step_reads_the_responses_of_one_decoupled_step(tmp_path, decoupled, message):
    """Each response of a decoupled step runs the steps that read it: a step (or the outputs)
    reading two decoupled steps' responses, or one's and the ensemble's inputs, cannot load."""
    config = load_model_config(
        make_model(tmp_path, "mixed", MIXED.format(second="mix"), model_file=None)
    )
    with pytest.raises(EnsembleProblem) as info:
        decoupled_flow(config, decoupled.__contains__)
    assert message in str(info.value)
    assert decoupled_flow(config, set().__contains__) is False
