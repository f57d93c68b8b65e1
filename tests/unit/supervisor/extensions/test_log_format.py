"""Log lines in Triton's two formats: level, time, process id, then ``file:line]``."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest

from shoal.supervisor.extensions.log_settings import TritonFormatter

pytestmark = pytest.mark.timeout(10)

# The shapes Triton's lines have (as its QA and log shippers parse them).
DEFAULT = re.compile(r"^[IWE]\d{4} \d{2}:\d{2}:\d{2}\.\d{6} \d+ [\w.]+:\d+\] (.*)$")
ISO8601 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z [IWE] \d+ [\w.]+:\d+\] (.*)$")


def _record(source: str | None = None) -> logging.LogRecord:
    record = logging.LogRecord("shoal.x", logging.WARNING, "/a/b/server.py", 42, "hi", (), None)
    if source is not None:
        record.source = source
    return record


@pytest.mark.parametrize(("log_format", "shape"), [("default", DEFAULT), ("ISO8601", ISO8601)])
def test_lines_name_the_source_file_and_line(log_format, shape):
    line = TritonFormatter(log_format).format(_record())
    assert shape.match(line), line
    assert " server.py:42] hi" in line


def test_a_models_line_names_its_model_file():
    line = TritonFormatter().format(_record("model.py:7"))
    assert DEFAULT.match(line) and " model.py:7] hi" in line, line


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
    assert "shoal debug" in done.stderr
    assert "library info" in done.stderr  # a library's info lines stay, as before
    assert "library debug" not in done.stderr
