"""Finding a model's requirements file and keying its venv (the build itself is tested with a
real server in tests/integration/test_requirements_env.py)."""

from __future__ import annotations

import pytest

from shoal.core.errors import InvalidArgument
from shoal.supervisor.models import venvs


def test_a_relative_name_is_looked_up_next_to_model_py_then_in_the_model_dir(tmp_path):
    version = tmp_path / "1"
    version.mkdir()
    (tmp_path / "requirements.txt").write_text("a\n")
    params = {venvs.PARAMETER: "requirements.txt"}
    found = venvs.requirements_file(params, str(tmp_path), str(version), "m")
    assert found == (tmp_path / "requirements.txt").resolve()
    (version / "requirements.txt").write_text("b\n")
    found = venvs.requirements_file(params, str(tmp_path), str(version), "m")
    assert found == (version / "requirements.txt").resolve()
    token = {venvs.PARAMETER: "$$TRITON_MODEL_DIRECTORY/requirements.txt"}
    found = venvs.requirements_file(token, str(tmp_path), str(version), "m")
    assert found == (tmp_path / "requirements.txt").resolve()


def test_no_parameter_means_no_venv_and_a_missing_file_names_where_it_looked(tmp_path):
    assert venvs.requirements_file({}, str(tmp_path), str(tmp_path / "1"), "m") is None
    with pytest.raises(InvalidArgument, match=r"model 'm': SHOAL_REQUIREMENTS 'req\.txt'"):
        venvs.requirements_file({venvs.PARAMETER: "req.txt"}, str(tmp_path), str(tmp_path), "m")


def test_the_key_follows_the_file_content(tmp_path):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("numpy==2.0\n")
    second.write_text("numpy==2.0\n")
    assert venvs.venv_key(first) == venvs.venv_key(second)
    second.write_text("numpy==2.1\n")
    assert venvs.venv_key(first) != venvs.venv_key(second)


def test_build_timeout_must_be_positive():
    assert venvs.build_timeout({}, "m") == venvs.DEFAULT_TIMEOUT
    assert venvs.build_timeout({venvs.TIMEOUT_PARAMETER: "30"}, "m") == 30.0
    with pytest.raises(InvalidArgument, match="positive number of seconds, got 'soon'"):
        venvs.build_timeout({venvs.TIMEOUT_PARAMETER: "soon"}, "m")
