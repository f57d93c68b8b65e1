"""The ``shoal`` command line as a user meets it: --version, python -m shoal, help texts."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

import shoal
from shoal._serve_parser import build_parser

pytestmark = pytest.mark.timeout(60)


def _subcommand(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]  # type: ignore[no-any-return]
    raise AssertionError("no subcommands")


def _shoal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shoal", *args], capture_output=True, text=True, timeout=50
    )


def test_version_through_python_m_shoal() -> None:
    done = _shoal("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"shoal {shoal.__version__}"


def test_top_level_help_is_for_users() -> None:
    done = _shoal("--help")
    assert done.returncode == 0
    assert "KServe V2" in done.stdout and "serve" in done.stdout and "perf" in done.stdout
    assert "Signals are handled" not in done.stdout  # the module docstring is for developers


@pytest.mark.parametrize("command", ["serve", "perf"])
def test_every_flag_has_help(command: str) -> None:
    missing = [
        action.option_strings[0]
        for action in _subcommand(command)._actions
        if action.option_strings and not action.help
    ]
    assert not missing, f"flags of 'shoal {command}' without help: {missing}"


def test_serve_help_shows_the_defaults() -> None:
    text = _subcommand("serve").format_help()
    for shown in (
        "(default: 8000)",
        "(default: 8001)",
        "(default: 8002)",
        "(default: 0.0.0.0)",
        "default: true)",  # --exit-on-error, as tritonserver
        "(default: none)",  # --model-control-mode
        "(default: 30.0)",  # --exit-timeout-secs
    ):
        assert shown in text, f"{shown} missing from 'shoal serve --help'"
    assert "default: [])" not in text and "(default: None)" not in text


def test_exit_on_error_defaults_to_true_as_triton() -> None:
    args = build_parser().parse_args(["serve", "--model-repository", "r"])
    assert args.exit_on_error is True
    args = build_parser().parse_args(["serve", "--model-repository", "r", "--exit-on-error=false"])
    assert args.exit_on_error is False


@pytest.mark.parametrize("size", ["0", "-1024"])
def test_http_max_input_size_must_be_positive_as_triton(
    size: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["serve", "--model-repository", "r", f"--http-max-input-size={size}"]
        )
    assert "Error: --http-max-input-size must be greater than 0." in capsys.readouterr().err
