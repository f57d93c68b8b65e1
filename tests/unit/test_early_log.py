"""``--log-file`` opened before the server's imports (a tool waiting for the file sees it at
once), and no file left behind by a command line the parser refuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shoal._early_log import log_file_flag

pytestmark = pytest.mark.timeout(60)

# Runs the ``shoal`` entry point with a command line; says whether the log file existed when
# shoal.cli (and with it the server's imports) began to load.
_WATCH = """
import os, sys
path = sys.argv[1]

class Watch:
    def find_spec(self, name, where=None, target=None):
        if name == "shoal.cli":
            print("at shoal.cli:", os.path.exists(path), flush=True)
        return None

sys.meta_path.insert(0, Watch())
from shoal._launch import main
sys.exit(main(sys.argv[2:]))
"""


def _launch(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WATCH, str(path), *args],
        capture_output=True,
        text=True,
        timeout=50,
    )


@pytest.mark.parametrize(
    ("argv", "path"),
    [
        (["serve", "--log-file", "a.log"], "a.log"),
        (["serve", "--log-file=a.log", "--log-file", "b.log"], "b.log"),
        (["serve", "--model-repository", "r"], ""),
        (["perf", "--log-file", "a.log"], ""),
        (["serve", "--log-file"], ""),
    ],
)
def test_the_flag_is_read_as_the_parser_reads_it(argv: list[str], path: str) -> None:
    assert log_file_flag(argv) == path


def test_the_log_file_exists_before_the_server_modules_load(tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    done = _launch(log_file, "serve", "--log-file", str(log_file), "--no-such-flag")
    assert "at shoal.cli: True" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 2, done.stderr
    assert not log_file.exists()  # refused: the empty file it made is gone


def test_a_refused_command_line_keeps_a_log_file_it_did_not_make(tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    log_file.write_text("earlier run\n")
    done = _launch(log_file, "serve", "--log-file", str(log_file), "--no-such-flag")
    assert done.returncode == 2, done.stderr
    assert log_file.read_text() == "earlier run\n"


@pytest.mark.timeout(90)
def test_the_server_logs_to_the_file_opened_early(tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    log_file.write_text("earlier run\n")
    missing = tmp_path / "missing"
    flags = ("--allow-grpc", "false", "--allow-metrics", "false", "--http-port", "0")
    done = _launch(
        log_file, "serve", "--log-file", str(log_file), "--model-repository", str(missing), *flags
    )
    assert done.returncode == 1, done.stderr
    earlier, line = log_file.read_text().splitlines()
    assert earlier == "earlier run"  # appended to, as Triton does
    assert line.startswith("E") and line.endswith(
        f"] \"model repository '{missing}' is not a directory\""
    )
