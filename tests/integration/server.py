"""Start a real ``shoal serve`` process on free loopback ports and stop it cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUNDLED = REPO_ROOT / "model_repository"
TEST_MODELS = Path(__file__).resolve().parent / "models"
#: ``SHOAL_TEST_FRONTEND_WORKERS=2 pytest tests/integration`` runs every server of the suite with
#: that many frontend workers (a test that names its own count keeps it). Without it the servers
#: run with one (the frontends in the core's process), whatever ``auto`` would pick here.
FRONTEND_WORKERS = os.environ.get("SHOAL_TEST_FRONTEND_WORKERS", "1")


def command_lines() -> Iterator[tuple[int, list[bytes]]]:
    """Every process's pid and arguments (those that exit while being read are skipped)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                yield int(entry), f.read().split(b"\0")
        except OSError:
            continue


def tcp_sockets(
    *, local_port: int | None = None, remote_port: int | None = None, listening: bool = False
) -> set[str]:
    """IPv4 TCP sockets with that local or remote port (only those listening, if asked), named
    as ``/proc/PID/fd`` links name them (``socket:[inode]``)."""
    found = set()
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            local, remote = (int(f.rsplit(":", 1)[1], 16) for f in fields[1:3])
            if local_port is not None and local != local_port:
                continue
            if remote_port is not None and remote != remote_port:
                continue
            if listening and fields[3] != "0A":  # TCP_LISTEN
                continue
            found.add(f"socket:[{fields[9]}]")
    return found


def holder(pids: list[int], sockets: set[str]) -> int | None:
    """The first of ``pids`` that holds one of ``sockets`` (:func:`tcp_sockets`), or None."""
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in sockets:
                    return pid
    return None


def _children(pid: int) -> set[int]:
    """Stub processes whose --parent is ``pid``."""
    found = set()
    marker = str(pid).encode()
    for entry, args in command_lines():
        if (
            b"shoal.stub" in args
            and b"--parent" in args
            and (args[args.index(b"--parent") + 1] == marker)
        ):
            found.add(entry)
    return found


class ShoalServer:
    """A ``shoal serve`` subprocess; ``url`` and ``grpc_url`` are its HTTP and gRPC addresses once
    started.

    ``metrics=True`` also serves ``/metrics`` on a free loopback port, read into ``metrics_port``.
    The test repositories hold models that fail to load on purpose, so the server starts with
    ``--exit-on-error=false`` (as Triton's own QA does) unless ``exit_on_error`` is set.
    """

    def __init__(
        self,
        *repos: Path,
        extra_args: tuple[str, ...] = (),
        timeout: float = 60.0,
        metrics: bool = False,
        exit_on_error: bool = False,
    ):
        self.repos = repos or (BUNDLED,)
        self.extra_args = extra_args
        self.metrics = metrics
        self.exit_on_error = exit_on_error
        self.metrics_port = 0
        self.timeout = timeout
        self.log = tempfile.NamedTemporaryFile(prefix="shoal-test-", suffix=".log", delete=False)
        self.proc: subprocess.Popen[bytes] | None = None
        self.http_port = 0
        self.grpc_port = 0

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> ShoalServer:
        args = [
            sys.executable,
            "-m",
            "shoal.cli",
            "serve",
            "--http-address",
            "127.0.0.1",
            "--http-port",
            "0",
            "--allow-grpc",
            "true",
            "--grpc-address",
            "127.0.0.1",
            "--grpc-port",
            "0",
        ]
        if self.metrics:
            args += ["--allow-metrics", "true", "--metrics-address", "127.0.0.1"]
            args += ["--metrics-port", "0"]
        else:
            args += ["--allow-metrics", "false"]
        for repo in self.repos:
            args += ["--model-repository", str(repo)]
        args += ["--exit-on-error", "true" if self.exit_on_error else "false"]
        args += list(self.extra_args)
        if FRONTEND_WORKERS and "--frontend-workers" not in args:
            args += ["--frontend-workers", FRONTEND_WORKERS]
        self.proc = subprocess.Popen(
            args, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT
        )
        try:
            self.http_port = self._wait_for_port()
            self.grpc_port = self._wait_for_port("grpc")
            if self.metrics:
                self.metrics_port = self._wait_for_port("metrics")
            self._wait_ready()
        except BaseException:
            # A server that did not come up in time is stopped, not left running with its
            # stubs (under load a start can pass the timeout; the error raised is about that).
            with contextlib.suppress(AssertionError):
                self.stop()
            raise
        return self

    def _wait_for_port(self, protocol: str = "http") -> int:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for line in Path(self.log.name).read_text(errors="replace").splitlines():
                if line.startswith(f"SHOAL_LISTENING {protocol} "):
                    return int(line.split()[-1])
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"shoal serve exited with {self.proc.returncode}:\n{self.output}"
                )
            time.sleep(0.02)  # polling the log for the bound port, not waiting on time
        raise TimeoutError(f"shoal serve did not bind within {self.timeout}s:\n{self.output}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2/health/live", timeout=2):
                    return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.02)
        raise TimeoutError(f"shoal serve not live within {self.timeout}s:\n{self.output}")

    @property
    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stub_pids(self) -> set[int]:
        assert self.proc is not None
        return _children(self.proc.pid)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Stop the server and check it left no stub process behind."""
        assert self.proc is not None
        pid = self.proc.pid
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"shoal serve did not stop within {timeout}s:\n{self.output}"
            ) from None
        deadline = time.monotonic() + 5
        while _children(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        left = _children(pid)
        for stray in left:
            os.kill(stray, signal.SIGKILL)
        assert not left, f"stub processes outlived the server: {left}\n{self.output}"
        return code

    def __enter__(self) -> ShoalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()
        self.log.close()
        os.unlink(self.log.name)
