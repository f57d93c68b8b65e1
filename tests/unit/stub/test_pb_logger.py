"""pb_utils.Logger: levels, the runtime sink and the stderr fallback."""

from __future__ import annotations

import re

import pytest

from shoal.stub import pb_utils
from shoal.stub.pb_utils import Logger


@pytest.fixture
def records():
    seen = []
    pb_utils._set_log_sink(
        lambda level, message, filename, lineno: seen.append((level, message, filename, lineno))
    )
    return seen


def test_levels_match_triton():
    assert (Logger.INFO, Logger.WARNING, Logger.ERROR, Logger.VERBOSE) == (0, 1, 2, 3)
    assert Logger.LogLevel.WARNING == Logger.WARNING


def test_log_defaults_to_info_and_tags_the_caller(records):
    line = _line() + 1
    Logger.log("hello")
    assert records == [(0, "hello", __file__, line)]


def test_each_helper_uses_its_level_and_the_callers_line(records):
    info_line = _line() + 1
    Logger.log_info("i")
    Logger.log_warn("w")
    Logger.log_error("e")
    Logger.log_verbose("v")
    Logger.log("x", Logger.ERROR)
    Logger.log("y", level=Logger.VERBOSE)
    assert [(level, message) for level, message, _, _ in records] == [
        (0, "i"),
        (1, "w"),
        (2, "e"),
        (3, "v"),
        (2, "x"),
        (3, "y"),
    ]
    assert all(filename == __file__ for _, _, filename, _ in records)
    assert records[0][3] == info_line
    assert [lineno for *_, lineno in records] == list(range(info_line, info_line + 6))


def test_instance_call_works_like_triton(records):
    Logger().log_info("from an instance")
    assert records[0][1] == "from an instance"


def test_fallback_writes_triton_format_to_stderr(capsys):
    line = _line() + 1
    Logger.log_warn("careful")
    Logger.log_error("broken")
    Logger.log_verbose("chatty")
    err = capsys.readouterr().err.splitlines()
    pattern = r"^W\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ test_pb_logger\.py:(\d+)\] careful$"
    match = re.match(pattern, err[0])
    assert match and int(match.group(1)) == line
    assert err[1].startswith("E") and err[1].endswith("] broken")
    assert err[2].startswith("I") and err[2].endswith("] chatty")


def test_removing_the_sink_restores_stderr(records, capsys):
    pb_utils._set_log_sink(None)
    Logger.log_info("to stderr")
    assert records == []
    assert capsys.readouterr().err.endswith("] to stderr\n")


def test_bad_arguments():
    with pytest.raises(TypeError):
        Logger.log(42)
    with pytest.raises(TypeError):
        Logger.log("x", 9)
    with pytest.raises(TypeError):  # a level's number is not a level (Triton's enum)
        Logger.log("x", 1)
    with pytest.raises(TypeError):
        Logger.log("x", None)
    with pytest.raises(TypeError):
        Logger.log("x", "INFO")


def _line() -> int:
    import sys

    return sys._getframe(1).f_lineno
