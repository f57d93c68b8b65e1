"""shoal against NVIDIA Triton's Python backend: the same models, the same load, one run.

    .venv/bin/python -m benchmarks.compare            # the full matrix, 5 s cells
    .venv/bin/python -m benchmarks.compare --quick    # a reduced matrix, 2 s cells

Both servers serve ``benchmarks/models`` on loopback ports and stay up for the whole run; each
cell is measured against one and then the other (the order flips from cell to cell), so drift on a
shared machine falls on both. Triton comes from the ``nvidia-pytriton`` wheel, installed into
``.bench-venv`` on first use (see ``docs/perf.md``). The load comes from ``shoal.perf``: wrk
(HTTP) and h2load (gRPC) when installed, else its built-in client. Results go to stdout as a
markdown table and to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from shoal.perf import CellResult, PerfError, RunConfig, run, summarize
from shoal.perf.cli import run_loop
from shoal.perf.report import row

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "benchmarks" / "models"
RESULTS = ROOT / "benchmarks" / "results"
BENCH_VENV = ROOT / ".bench-venv"
TRITON_WHEEL = "nvidia-pytriton==0.7.0"
START_TIMEOUT_S = 120.0
KIB, MIB = 1024, 1024 * 1024


# --- the matrix ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One line of the table: a model under one protocol, payload and concurrency."""

    model: str
    protocol: str
    concurrency: int
    payload_bytes: int | None = None
    input_data: dict[str, Any] | None = None
    streaming: bool = False

    @property
    def label(self) -> str:
        size = "" if self.payload_bytes is None else f" {_size(self.payload_bytes)}"
        return f"{self.model} {self.protocol}{size} c={self.concurrency}"


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB" if n >= KIB else f"{n} B"


STREAM_TOKENS = 32
_STREAM_INPUT = {
    "inputs": [{"name": "COUNT", "datatype": "INT32", "shape": [1], "data": [STREAM_TOKENS]}]
}


def matrix(quick: bool) -> list[Cell]:
    """The issue's matrix; ``quick`` keeps one cell of each kind that matters most."""
    if quick:
        return [
            Cell("identity_fp32", "http", 1, 64),
            Cell("identity_fp32", "http", 8, 64),
            Cell("identity_fp32", "grpc", 8, 64),
            Cell("identity_fp32", "http", 8, 64 * KIB),
            Cell("identity_fp32", "http", 8, 4 * MIB),
            Cell("identity_fp32", "grpc", 8, 4 * MIB),
            Cell("batched_identity", "http", 16, 64),
            Cell("ensemble_add_sub", "grpc", 8, 64),
            Cell("bls_add_sub", "grpc", 8, 64),
            Cell("token_streamer", "grpc", 8, input_data=_STREAM_INPUT, streaming=True),
        ]
    cells = [
        Cell("identity_fp32", protocol, level, size)
        for protocol in ("http", "grpc")
        for size in (64, 64 * KIB, 4 * MIB)
        for level in (1, 8)
    ]
    cells += [Cell("add_sub", p, 8, 64) for p in ("http", "grpc")]
    cells += [
        Cell("batched_identity", p, level, 64) for p in ("http", "grpc") for level in (16, 64)
    ]
    cells += [
        Cell(m, p, 8, 64) for m in ("ensemble_add_sub", "bls_add_sub") for p in ("http", "grpc")
    ]
    cells += [
        Cell("token_streamer", "grpc", level, input_data=_STREAM_INPUT, streaming=True)
        for level in (1, 8)
    ]
    return cells


# --- servers -------------------------------------------------------------------------------------


@dataclass
class Server:
    """A running server: its name, process, and the ports it bound."""

    name: str
    process: subprocess.Popen[bytes]
    ports: dict[str, int] = field(default_factory=dict)
    version: str = ""

    def address(self, protocol: str) -> str:
        return f"127.0.0.1:{self.ports[protocol]}"


def _read_listening(process: subprocess.Popen[bytes], wanted: Sequence[str]) -> dict[str, int]:
    """Ports from shoal's ``SHOAL_LISTENING <proto> <host> <port>`` lines on stdout."""
    assert process.stdout is not None
    ports: dict[str, int] = {}
    while not set(wanted) <= set(ports):
        line = process.stdout.readline().decode(errors="replace")
        if not line:
            raise RuntimeError(f"shoal serve exited with {process.wait()} before listening")
        parts = line.split()
        if len(parts) == 4 and parts[0] == "SHOAL_LISTENING":
            ports[parts[1]] = int(parts[3])
    return ports


def _drain(process: subprocess.Popen[bytes], log: BinaryIO) -> None:
    """Keep copying stdout to the log, so a chatty server never blocks on a full pipe."""
    assert process.stdout is not None
    for line in process.stdout:
        log.write(line)


def _wait_ready(server: Server) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    url = f"http://{server.address('http')}"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as answer:
                if answer.status == 200:
                    with urllib.request.urlopen(f"{url}/v2", timeout=2) as info:
                        server.version = json.load(info).get("version", "")
                    return
        except OSError:
            pass
        time.sleep(0.2)  # polling readiness of a process we started
    raise RuntimeError(f"{server.name} not ready within {START_TIMEOUT_S} s")


def _stop(server: Server) -> None:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(60)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


def _shoal_command(root: Path) -> tuple[list[str], dict[str, str]]:
    """How to run the shoal of checkout ``root``: its own venv's ``shoal``, else this
    interpreter with ``root`` first on the import path (a build without a venv of its own)."""
    own = root / ".venv" / "bin" / "shoal"
    if own.exists():
        return [str(own)], dict(os.environ)
    env = dict(os.environ, PYTHONPATH=str(root))
    return [sys.executable, "-m", "shoal"], env


def start_shoal(
    log: BinaryIO,
    models: Path = MODELS,
    extra: Sequence[str] = (),
    root: Path = ROOT,
    name: str = "shoal",
) -> Server:
    program, env = _shoal_command(root)
    command = [
        *program,
        "serve",
        "--model-repository",
        str(models),
        *("--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1"),
        *("--metrics-address", "127.0.0.1"),
        *("--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"),
        *extra,
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, cwd=root, env=env)
    server = Server(name, process)
    try:
        server.ports = _read_listening(process, ("http", "grpc"))
        threading.Thread(target=_drain, args=(process, log), daemon=True).start()
        _wait_ready(server)
    except BaseException:
        _stop(server)
        raise
    return server


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def ensure_bench_venv(venv: Path = BENCH_VENV) -> Path:
    """``venv`` with the Triton wheel installed; created on first use. Returns site-packages."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    found = list((venv / "lib").glob("python3*/site-packages/pytriton/tritonserver/bin"))
    if not found:
        pip = [str(python), "-m", "pip", "install", "--quiet", TRITON_WHEEL, "numpy"]
        subprocess.run(pip, check=True)
    return _site_packages(venv)


def assemble_triton(site: Path, tree: Path, venv: Path = BENCH_VENV) -> Path:
    """Copy ``backends/`` and ``caches/`` next to each other and put the stub for the venv's
    Python beside the Python backend, as pytriton does. Returns the server binary."""
    bundled = site / "pytriton" / "tritonserver"
    for part in ("backends", "caches"):
        shutil.rmtree(tree / part, ignore_errors=True)
        shutil.copytree(bundled / part, tree / part)
    version = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    stub = bundled / "python_backend_stubs" / version / "triton_python_backend_stub"
    shutil.copy2(stub, tree / "backends" / "python" / stub.name)
    return bundled / "bin" / "tritonserver"


def start_triton(log: BinaryIO, models: Path = MODELS, extra: Sequence[str] = ()) -> Server:
    site = ensure_bench_venv()
    tree = RESULTS / "triton-tree"
    tree.mkdir(parents=True, exist_ok=True)
    binary = assemble_triton(site, tree)
    ports = {"http": _free_port(), "grpc": _free_port(), "metrics": _free_port()}
    command = [str(binary), f"--model-repository={models}", *extra]
    command += [f"--backend-directory={tree / 'backends'}", f"--cache-directory={tree / 'caches'}"]
    for proto, port in ports.items():
        command += [f"--{proto}-address=127.0.0.1", f"--{proto}-port={port}"]
    command += ["--allow-gpu-metrics=false"]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(site / "nvidia_pytriton.libs")
    env["PATH"] = f"{BENCH_VENV / 'bin'}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(site)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = Server("triton", process, ports)
    try:
        _wait_ready(server)
    except BaseException:
        _stop(server)
        raise
    return server


class Supervised:
    """A server that is started again, and the crash noted, when it died since the last cell."""

    def __init__(self, name: str, start: Callable[[BinaryIO], Server]) -> None:
        self.name, self._start = name, start
        self._log = (RESULTS / f"{name}.log").open("ab")
        self._server: Server | None = None
        self.crashes: list[str] = []

    def ensure(self, before: str) -> Server:
        if self._server is not None and self._server.process.poll() is not None:
            code = self._server.process.returncode
            self.crashes.append(f"{self.name} exited with {code} before cell '{before}'")
            print(f"{self.crashes[-1]}: starting it again", file=sys.stderr, flush=True)
            self._server = None
        if self._server is None:
            self._server = self._start(self._log)
        return self._server

    def close(self) -> None:
        if self._server is not None:
            _stop(self._server)
        self._log.close()


# --- measuring -----------------------------------------------------------------------------------


def tree_cpu_seconds(root: int) -> float:
    """CPU time (user + system) of ``root`` and every live descendant, from ``/proc``."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    family, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        family.update(children)
        frontier.extend(children)
    return sum(times.get(pid, 0.0) for pid in family)


@dataclass(frozen=True)
class Measured:
    server: str
    result: CellResult
    server_cpu_percent: float


def measure_cell(
    server: Server, cell: Cell, client: str, duration_s: float, warmup_s: float
) -> Measured:
    """One cell against one server; the server's CPU is averaged over warm-up + window."""
    input_file = None
    if cell.input_data is not None:
        input_file = RESULTS / f"{cell.model}-inputs.json"
        input_file.write_text(json.dumps(cell.input_data))
    chosen = "python" if cell.streaming else client
    if chosen == "native":
        chosen = "wrk" if cell.protocol == "http" else "h2load"
    config = RunConfig(
        model=cell.model,
        url=server.address(cell.protocol),
        protocol=cell.protocol,
        payload_bytes=cell.payload_bytes,
        input_data=input_file,
        concurrency=(cell.concurrency,),
        duration_s=duration_s,
        warmup_s=warmup_s,
        streaming=cell.streaming,
        client=chosen,
    )
    cpu_before, wall_before = tree_cpu_seconds(server.process.pid), time.monotonic()
    (result,) = run_loop(run(config))
    cpu = tree_cpu_seconds(server.process.pid) - cpu_before
    return Measured(server.name, result, 100 * cpu / (time.monotonic() - wall_before))


def native_available() -> bool:
    return shutil.which("wrk") is not None and shutil.which("h2load") is not None


# --- report --------------------------------------------------------------------------------------


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b and a == a and b == b else "n/a"


def _cost(measured: Measured, rate: float) -> str:
    """Server CPU microseconds per request (or per streamed response)."""
    return f"{measured.server_cpu_percent * 1e4 / rate:,.0f}" if rate > 0 else "n/a"


def _rate(result: CellResult, streaming: bool) -> float:
    return result.responses_per_s if streaming else result.throughput


def markdown(rows: Sequence[tuple[Cell, Measured, Measured]], peer: str = "Triton") -> str:
    """The ratio table: > 1 means shoal is faster (throughput) or slower (p50) than ``peer``."""
    lines = [
        f"| cell | shoal /s | {peer} /s | throughput shoal/{peer} | shoal p50 ms | {peer} p50 ms "
        f"| p50 shoal/{peer} | server CPU % shoal / {peer} | server CPU µs per request "
        f"shoal / {peer} | client CPU % shoal / {peer} | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cell, ours, theirs in rows:
        a, b = ours.result, theirs.result
        rate_a, rate_b = _rate(a, cell.streaming), _rate(b, cell.streaming)
        unit = " (responses)" if cell.streaming else ""
        lines.append(
            f"| {cell.label}{unit} | {rate_a:,.0f} | {rate_b:,.0f} | {_ratio(rate_a, rate_b)} "
            f"| {a.latency_ms.p50:.2f} | {b.latency_ms.p50:.2f} "
            f"| {_ratio(a.latency_ms.p50, b.latency_ms.p50)} "
            f"| {ours.server_cpu_percent:.0f} / {theirs.server_cpu_percent:.0f} "
            f"| {_cost(ours, rate_a)} / {_cost(theirs, rate_b)} "
            f"| {a.client_cpu_percent:.0f} / {b.client_cpu_percent:.0f} "
            f"| {a.errors} / {b.errors} |"
        )
    return "\n".join(lines)


def _record(cell: Cell, measured: Measured) -> dict[str, Any]:
    return {"cell": cell.label, "server": measured.server, **row(measured.result)} | {
        "server_cpu_percent": measured.server_cpu_percent
    }


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="benchmarks.compare", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="reduced matrix, 2 s cells")
    parser.add_argument("--duration", type=float, help="seconds per cell (default 5, quick 2)")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--client", choices=("auto", "python", "native"), default="auto")
    parser.add_argument("--only", default="", help="run only cells whose label has this text")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of another shoal (an earlier commit, built or not) measured in Triton's "
        "place: old and new side by side in one run",
    )
    parser.add_argument(
        "--shoal-args",
        default="",
        help="more flags for this checkout's shoal, one string: '--frontend-workers 2'",
    )
    parser.add_argument(
        "--baseline-args", default="", help="more flags for the --baseline shoal, one string"
    )
    return parser.parse_args(argv)


def _measure_or_fail(
    supervised: Supervised, cell: Cell, client: str, duration: float, warmup: float
) -> Measured:
    """A cell that cannot run (its server died, a request failed fatally) is recorded empty."""
    try:
        return measure_cell(supervised.ensure(cell.label), cell, client, duration, warmup)
    except PerfError as error:
        failed = summarize(
            model=cell.model,
            protocol=cell.protocol,
            client=client,
            concurrency=cell.concurrency,
            duration_s=duration,
            latencies_ns=[],
            errors=1,
            error_samples=[str(error)],
        )
        print(f"{cell.label}: {supervised.name} failed: {error}", file=sys.stderr, flush=True)
        return Measured(supervised.name, failed, 0.0)


def run_matrix(
    servers: Sequence[Supervised],
    cells: Sequence[Cell],
    client: str,
    duration: float,
    warmup: float,
) -> list[tuple[Cell, Measured, Measured]]:
    rows = []
    for index, cell in enumerate(cells):
        order = servers if index % 2 == 0 else list(reversed(servers))
        got = {s.name: _measure_or_fail(s, cell, client, duration, warmup) for s in order}
        ours, theirs = (got[s.name] for s in servers)
        rows.append((cell, ours, theirs))
        rate = [f"{m.server} {_rate(m.result, cell.streaming):,.0f}/s" for m in got.values()]
        print(f"{cell.label}: {', '.join(rate)}", file=sys.stderr, flush=True)
    return rows


def _servers(
    baseline: Path | None, ours_extra: Sequence[str] = (), baseline_extra: Sequence[str] = ()
) -> tuple[str, list[Supervised]]:
    """This checkout's shoal (with ``ours_extra`` flags) and its peer: Triton, or the shoal of
    ``baseline`` (with ``baseline_extra``: the same tree twice compares two settings)."""

    def start_ours(log: BinaryIO) -> Server:
        return start_shoal(log, extra=ours_extra)

    ours = Supervised("shoal", start_ours)
    if baseline is None:
        return "Triton", [ours, Supervised("triton", start_triton)]
    root = baseline.resolve()

    def start_baseline(log: BinaryIO) -> Server:
        return start_shoal(log, extra=baseline_extra, root=root, name="baseline")

    return f"baseline {root.name}", [ours, Supervised("baseline", start_baseline)]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    duration = args.duration or (2.0 if args.quick else 5.0)
    client = args.client
    if client == "auto":
        client = "native" if native_available() else "python"
    cells = [c for c in matrix(args.quick) if args.only in c.label]
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    peer, servers = _servers(args.baseline, args.shoal_args.split(), args.baseline_args.split())
    try:
        other = servers[1].ensure("start")
        servers[0].ensure("start")
        print(f"shoal and {peer} {other.version} are up; {len(cells)} cells", file=sys.stderr)
        rows = run_matrix(servers, cells, client, duration, args.warmup)
    finally:
        for server in servers:
            server.close()
    table = markdown(rows, peer)
    crashes = [crash for server in servers for crash in server.crashes]
    records = [_record(cell, m) for cell, *pair in rows for m in pair]
    document = {"client": client, "duration_s": duration, "crashes": crashes, "cells": records}
    (RESULTS / f"compare-{stamp}.json").write_text(json.dumps(document, indent=2) + "\n")
    (RESULTS / f"compare-{stamp}.md").write_text(table + "\n")
    print(f"client: {client}, {duration:g} s cells after {args.warmup:g} s warm-up")
    print(table)
    for crash in crashes:
        print(f"* {crash} (restarted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
