"""Log lines in Triton's two formats: level, time, process id, then ``file:line]``."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

import pytest

from shoal.supervisor.extensions.log_settings import LOG_BLOCK, TritonFormatter

pytestmark = pytest.mark.timeout(10)

# The shapes Triton's lines have (as its QA and log shippers parse them).
DEFAULT = re.compile(r"^[IWE]\d{4} \d{2}:\d{2}:\d{2}\.\d{6} \d+ [\w.]+:\d+\] (.*)$")
ISO8601 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z [IWE] \d+ [\w.]+:\d+\] (.*)$")


def _record(
    source: str | None = None, message: str = "hi", level: int = logging.WARNING
) -> logging.LogRecord:
    record = logging.LogRecord("shoal.x", level, "/a/b/server.py", 42, message, (), None)
    if source is not None:
        record.source = source
    return record


@pytest.mark.parametrize(("log_format", "shape"), [("default", DEFAULT), ("ISO8601", ISO8601)])
def test_lines_name_the_source_file_and_line(log_format, shape):
    line = TritonFormatter(log_format).format(_record())
    assert shape.match(line), line
    assert line.endswith(' server.py:42] "hi"'), line


def test_a_models_line_names_its_model_file():
    line = TritonFormatter().format(_record("model.py:7"))
    assert DEFAULT.match(line) and line.endswith(' model.py:7] "hi"'), line


@pytest.mark.timeout(60)
def test_verbose_logs_shoals_debug_lines_and_not_the_libraries():
    """--log-verbose printed hpack's debug lines, a few per header of every gRPC call."""
    code = (
        "import logging\n"
        "from shoal.supervisor.extensions.log_settings import configure_logging\n"
        "from shoal.supervisor.options import ServerOptions\n"
        "configure_logging(ServerOptions(model_repositories=('r',), log_verbose=1))\n"
        "logging.getLogger('hpack.hpack').debug('library debug')\n"
        "logging.getLogger('grpc._cython').info('library info')\n"
        "logging.getLogger('shoal.server').debug('shoal debug')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True
    )
    assert "shoal debug" in done.stdout
    assert "library info" in done.stdout  # a library's info lines stay, as before
    assert "library debug" not in done.stdout + done.stderr


@pytest.mark.timeout(60)
def test_info_lines_go_to_stdout_and_warnings_and_errors_to_stderr_as_in_triton():
    """Without --log-file Triton writes INFO (and verbose) lines to stdout, WARNING and ERROR
    to stderr (common's Logger::Log); a stub's stderr, relayed marked, stays on stderr."""
    code = (
        "import logging\n"
        "from shoal.supervisor.extensions.log_settings import configure_logging\n"
        "from shoal.supervisor.options import ServerOptions\n"
        "configure_logging(ServerOptions(model_repositories=('r',), log_verbose=1))\n"
        "log = logging.getLogger('shoal.server')\n"
        "log.debug('a verbose line')\n"
        "log.info('an info line')\n"
        "log.warning('a warning line')\n"
        "log.error('an error line')\n"
        "log.info('[m_0] from the stub stderr', extra={'stderr': True})\n"
        "log.info('[m_0] from the stub stdout', extra={'stderr': False})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True
    )
    out, err = done.stdout, done.stderr
    for text in ("a verbose line", "an info line", "from the stub stdout"):
        assert text in out and text not in err, (out, err)
    for text in ("a warning line", "an error line", "from the stub stderr"):
        assert text in err and text not in out, (out, err)


# A client's text (an input name) that would read as a record of its own, with a terminal
# escape sequence: what Triton's L0_logging injects.
FORGED = "I0205 18:34:18.707423 1 file.cc:123] INJECTED \x1b[31mRED\x1b[0m\x07"


def test_a_message_is_one_json_string_that_no_client_text_can_end():
    message = f"unexpected inference input '\n{FORGED}\n' for \"model\" \\ \u2028\x9b\udc80"
    line = TritonFormatter().format(_record(message=message))
    assert "\n" not in line and "\x1b" not in line and "\x9b" not in line
    assert json.loads(DEFAULT.match(line).group(1)) == message
    # rapidjson's escapes, as Triton writes them
    assert "\\nI0205 18:34:18.707423 1 file.cc:123] INJECTED \\u001B[31mRED" in line


def test_without_escaping_the_message_is_printed_as_it_is():
    """TRITON_SERVER_ESCAPE_LOG_MESSAGES=0: what the escaping prevents."""
    line = TritonFormatter(escape=False).format(_record(message=f"name '\n{FORGED}\n'"))
    assert line.endswith(f"] name '\n{FORGED}\n'"), line
    assert FORGED in line.splitlines()


def test_a_traceback_is_part_of_the_escaped_message():
    try:
        raise RuntimeError("boom\nI0101 00:00:00.000000 1 x.py:1] fake")
    except RuntimeError:
        record = logging.LogRecord(
            "shoal.x", logging.ERROR, "/a/server.py", 3, "failed", (), sys.exc_info()
        )
    escaped = TritonFormatter().format(record)
    assert len(escaped.splitlines()) == 1, escaped
    text = json.loads(DEFAULT.match(escaped).group(1))
    assert text.startswith("failed\nTraceback") and "RuntimeError: boom\nI0101" in text
    record.exc_text = None
    raw = TritonFormatter(escape=False).format(record)
    assert raw.splitlines()[-1] == "I0101 00:00:00.000000 1 x.py:1] fake"


def test_a_table_follows_its_escaped_heading_unescaped():
    table = "+---+\n| a |\n+---+"
    record = _record(message="models:", level=logging.INFO)
    setattr(record, LOG_BLOCK, table)
    assert TritonFormatter().format(record).endswith('] "models:"\n' + table)
    assert TritonFormatter(escape=False).format(record).endswith("] models:\n" + table)
    record = _record(message="", level=logging.INFO)  # no heading: Triton's own tables
    setattr(record, LOG_BLOCK, table)
    assert TritonFormatter().format(record).endswith("] \n" + table)


def test_verbose_lines_are_info_lines_as_in_triton():
    """Triton has three letters (its QA checks them); debug lines read D before."""
    letters = [
        TritonFormatter().format(_record(level=level))[0]
        for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
    ]
    assert letters == ["I", "I", "W", "E", "E"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("value", "escaped"), [(None, True), ("1", True), ("0", False)])
def test_the_environment_variable_turns_escaping_off(value, escaped):
    code = (
        "import logging\n"
        "from shoal.supervisor.extensions.log_settings import configure_logging\n"
        "from shoal.supervisor.options import ServerOptions\n"
        "configure_logging(ServerOptions(model_repositories=('r',)))\n"
        "logging.getLogger('shoal.server').info('say \"hi\"')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_SERVER_ESCAPE_LOG_MESSAGES"}
    if value is not None:
        env["TRITON_SERVER_ESCAPE_LOG_MESSAGES"] = value
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, env=env
    )
    expected = '] "say \\"hi\\""' if escaped else '] say "hi"'
    assert done.stdout.rstrip("\n").endswith(expected), done.stdout
