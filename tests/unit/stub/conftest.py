"""Every stub test starts and ends with pb_utils' runtime hooks unset."""

from __future__ import annotations

import pytest

from shoal.stub import pb_utils


def _reset() -> None:
    pb_utils._set_log_sink(None)
    pb_utils._set_bls_executor(None)
    pb_utils._set_model_controller(None)
    pb_utils._set_model_dir(None)


@pytest.fixture(autouse=True)
def _clean_hooks():
    _reset()
    yield
    _reset()
