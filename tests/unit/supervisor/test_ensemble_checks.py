"""Load-time ensemble checks against step models (shoal/supervisor/_ensemble_checks.py), with the
integration test models' configurations."""

from __future__ import annotations

import pytest

from shoal.config import load_model_config
from shoal.supervisor._ensemble_checks import EnsembleProblem, check_ensemble
from tests.integration.server import BUNDLED, TEST_MODELS

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
        ("ens_bad_shape", "tensor 'X' has shape [3] but 'X' of model 'ens_diamond' has shape [4]"),
        ("ens_bad_dtype", "tensor 'X' is INT32 but 'INPUT0' of model 'add_sub' is FP32"),
        ("ens_inner_unknown", "uses model 'no_such_model', which is in no model repository"),
    ],
)
def test_problems_name_the_ensemble_and_the_tensor(name, message):
    with pytest.raises(EnsembleProblem) as info:
        _check(name)
    assert message in str(info.value)
