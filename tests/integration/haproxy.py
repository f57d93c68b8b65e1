"""shoal replicas on loopback behind a real haproxy, and a threaded tritonclient load through it.

Shared by ``tests/integration/test_load_balancer.py`` (reduced form, in CI) and
``benchmarks/replicas.py`` (the full run). haproxy checks each replica's ``/v2/health/ready``
actively and retries a request elsewhere when a replica refuses the connection, closes it without an
answer or answers 503 (what a draining shoal answers), so a rolling restart loses no request.
"""

from __future__ import annotations

import csv
import io
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from tests.integration.server import BUNDLED, ShoalServer

#: What haproxy retries on another replica. ``empty-response`` also re-sends the requests that were
#: inside a replica that died: right for stateless models, wrong for sequences or side effects.
RETRY_ON = "conn-failure empty-response 503"


def haproxy_binary() -> str | None:
    return shutil.which("haproxy")


def free_port() -> int:
    """A loopback port that was free a moment ago (haproxy cannot report a port 0 bind)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def render_config(
    port: int,
    servers: dict[str, int],
    stats_socket: Path,
    *,
    maxconn: int | None = None,
    retry_on: str = RETRY_ON,
    check_interval_ms: int = 200,
) -> str:
    """An haproxy configuration: one HTTP frontend on ``port``, round-robin over ``servers``.

    ``maxconn`` caps the requests in flight at each replica (others wait in haproxy's queue), which
    bounds what a replica's death can lose. Round robin rather than leastconn: a dead replica that
    is not yet marked down has no connections, and leastconn would send it everything.
    """
    limit = f" maxconn {maxconn}" if maxconn else ""
    lines = [
        "global",
        f"    stats socket {stats_socket} mode 600 level admin",
        "    maxconn 4096",
        "defaults",
        "    mode http",
        "    timeout connect 2s",
        "    timeout client 30s",
        "    timeout server 30s",
        "    timeout queue 30s",
        "    timeout check 2s",  # a busy replica answers its check late, but it is not down
        "    retries 3",
        "    option redispatch 1",  # every retry picks another replica
        f"    retry-on {retry_on}",
        "frontend shoal",
        f"    bind 127.0.0.1:{port}",
        "    default_backend replicas",
        "backend replicas",
        "    balance roundrobin",
        "    option httpchk GET /v2/health/ready",
        "    http-check expect status 200",
        # A refused connection takes a replica out at once, before the next active check: else
        # a retry could pick the dead replica again (with maxconn, the only one with free slots).
        f"    default-server check inter {check_interval_ms} fall 2 rise 2{limit}"
        " observe layer4 error-limit 1 on-error mark-down",
    ]
    lines += [f"    server {name} 127.0.0.1:{p}" for name, p in servers.items()]
    return "\n".join(lines) + "\n"


class HAProxy:
    """A foreground ``haproxy`` process; ``states()`` reads its view of each replica."""

    def __init__(
        self, servers: dict[str, int], *, maxconn: int | None = None, retry_on: str = RETRY_ON
    ) -> None:
        binary = haproxy_binary()
        if binary is None:
            raise RuntimeError("haproxy is not installed (apt-get install haproxy)")
        self._dir = tempfile.TemporaryDirectory(prefix="shoal-haproxy-")
        self.stats_socket = Path(self._dir.name) / "stats.sock"
        self.port = free_port()
        cfg = Path(self._dir.name) / "haproxy.cfg"
        config = render_config(
            self.port, servers, self.stats_socket, maxconn=maxconn, retry_on=retry_on
        )
        cfg.write_text(config)
        self._log = open(Path(self._dir.name) / "haproxy.log", "w+b")
        self.proc = subprocess.Popen(
            [binary, "-db", "-f", str(cfg)], stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self, text: str) -> str:
        """One command on the runtime API (``show stat``, ``disable server ...``)."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.stats_socket))
            sock.sendall(text.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def states(self) -> dict[str, str]:
        """Replica name -> haproxy's status of it (``UP``, ``DOWN``, ``UP 1/2`` ...)."""
        rows = csv.DictReader(io.StringIO(self.command("show stat").lstrip("# ")))
        return {
            row["svname"]: row["status"]
            for row in rows
            if row["pxname"] == "replicas" and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_for(self, name: str, status: str, timeout: float = 30.0) -> float:
        """Wait until haproxy reports ``name`` as ``status``; return the seconds it took."""
        started = time.monotonic()
        deadline = started + timeout
        seen: dict[str, str] = {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proc.returncode}:\n{self.output}")
            try:
                seen = self.states()
            except OSError:
                seen = {}  # the stats socket is not there yet
            if seen.get(name) == status:
                return time.monotonic() - started
            time.sleep(0.02)  # polling haproxy's view of the replica, not waiting on time
        raise TimeoutError(f"haproxy did not see replica {name} {status} in {timeout}s: {seen}")

    @property
    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)  # soft stop
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self._dir.cleanup()

    def __enter__(self) -> HAProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def replica_args(port: int = 0, exit_timeout: int = 30) -> tuple[str, ...]:
    """One replica serving the bundled ``add_sub``; haproxy balances its HTTP port."""
    return (
        "--http-port",
        str(port),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "add_sub",
        "--exit-timeout-secs",
        str(exit_timeout),
    )


class Replicas:
    """``count`` shoal servers, ``r0``, ``r1`` ...; a restarted replica keeps its port."""

    def __init__(self, count: int) -> None:
        self.servers = {
            f"r{i}": ShoalServer(BUNDLED, extra_args=replica_args()) for i in range(count)
        }
        errors: list[BaseException] = []

        def start(server: ShoalServer) -> None:
            try:
                server.start()
            except BaseException as exc:  # re-raised below, in the caller's thread
                errors.append(exc)

        # Side by side: each start is mostly waiting for Python imports and the model to load.
        starting = [threading.Thread(target=start, args=(s,)) for s in self.servers.values()]
        for thread in starting:
            thread.start()
        for thread in starting:
            thread.join()
        if errors:
            self.close()
            raise errors[0]

    @property
    def ports(self) -> dict[str, int]:
        return {name: server.http_port for name, server in self.servers.items()}

    def kill(self, name: str) -> None:
        """SIGKILL the replica's supervisor; its stubs follow it (checked at restart or close)."""
        server = self.servers[name]
        assert server.proc is not None
        server.proc.kill()
        server.proc.wait()

    def restart(self, name: str, sig: int = signal.SIGTERM) -> int:
        """Stop the replica with ``sig`` (SIGTERM drains) and start it again on the same port."""
        old = self.servers[name]
        code = old.stop(sig)
        old.__exit__(None, None, None)
        self.servers[name] = ShoalServer(BUNDLED, extra_args=replica_args(old.http_port)).start()
        return code

    def close(self) -> None:
        for server in self.servers.values():
            try:
                if server.proc is not None:
                    server.stop()  # also checks that no stub outlived a killed replica
            finally:
                server.__exit__(None, None, None)

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class LoadResult:
    """What a :class:`Load` saw: each request's start and end (monotonic) and its error, if any."""

    ok: list[tuple[float, float]] = field(default_factory=list)
    failed: list[tuple[float, float, str]] = field(default_factory=list)

    def rate(self) -> float:
        if not self.ok:
            return 0.0
        first = min(start for start, _ in self.ok)
        last = max(end for _, end in self.ok)
        return len(self.ok) / max(last - first, 1e-9)


class Load:
    """``concurrency`` threads, each a ``tritonclient.http`` client sending ``add_sub`` requests
    through ``url`` back to back until :meth:`stop`."""

    def __init__(self, url: str, concurrency: int) -> None:
        self._url = url
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.result = LoadResult()
        self._threads = [
            threading.Thread(target=self._worker, name=f"load-{i}", daemon=True)
            for i in range(concurrency)
        ]

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def count(self) -> int:
        with self._lock:
            return len(self.result.ok) + len(self.result.failed)

    def stop(self) -> LoadResult:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        return self.result

    def _worker(self) -> None:
        client = httpclient.InferenceServerClient(self._url, network_timeout=30)
        data = np.arange(4, dtype=np.float32)
        inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
        for inp in inputs:
            inp.set_data_from_numpy(data)
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    answer = client.infer("add_sub", inputs).as_numpy("OUTPUT0")
                    error = None if np.array_equal(answer, data + data) else f"wrong: {answer}"
                except Exception as exc:  # every failure is counted, whatever its kind
                    error = f"{type(exc).__name__}: {exc}"
                    client.close()  # a fresh connection for the next request
                    client = httpclient.InferenceServerClient(self._url, network_timeout=30)
                ended = time.monotonic()
                with self._lock:
                    if error is None:
                        self.result.ok.append((started, ended))
                    else:
                        self.result.failed.append((started, ended, error))
        finally:
            client.close()
