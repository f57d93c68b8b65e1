"""Dynamic batching on and off: the same batched identity model, side by side, in one run.

    .venv/bin/python -m benchmarks.batching                 # c=16 and c=64, 5 s cells
    .venv/bin/python -m benchmarks.batching --write         # ... and benchmarks/results/batching.md

One ``shoal serve`` serves two copies of ``benchmarks/models/batched_identity``: as configured
(``dynamic_batching { max_queue_delay_microseconds: 1000 }``, ``max_batch_size: 64``) and the
same without ``dynamic_batching`` (one request per ``execute``). Every cell drives one of them
with ``shoal.perf``'s closed-loop client over HTTP, and reads the model's statistics before and
after it: ``exec/inference`` is executions per inference (1.0 without batching; 1/average batch
size with it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from shoal.perf import CellResult, RunConfig, run
from shoal.perf.cli import run_loop

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "benchmarks" / "models" / "batched_identity"
RESULT = ROOT / "benchmarks" / "results" / "batching.md"
BATCHED, UNBATCHED = "batched_identity", "batched_identity_nobatch"
INPUT = (("INPUT0", "FP32", (1, 16)),)  # one inference of 64 bytes per request
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Row:
    batching: bool
    result: CellResult
    executions: int
    inferences: int

    @property
    def exec_per_inference(self) -> float:
        return self.executions / self.inferences if self.inferences else float("nan")


def make_repository(root: Path) -> None:
    """``root`` holds the model as configured and a copy without ``dynamic_batching``."""
    shutil.copytree(MODEL, root / BATCHED)
    shutil.copytree(MODEL, root / UNBATCHED)
    config = root / UNBATCHED / "config.pbtxt"
    lines = config.read_text().splitlines()
    kept = [line for line in lines if not line.startswith("dynamic_batching")]
    text = "\n".join(kept).replace(f'name: "{BATCHED}"', f'name: "{UNBATCHED}"')
    config.write_text(text + "\n")


def start_server(repository: Path, log: IO[bytes]) -> tuple[subprocess.Popen[bytes], str]:
    process, urls = start_listening(repository, log)
    return process, urls["http"]


def start_listening(
    repository: Path, log: IO[bytes], extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """``shoal serve`` on ``repository`` (gRPC and metrics off unless ``extra`` turns them on),
    ready; returns the process and the address of each endpoint it listens on."""
    command = [
        sys.executable,
        *("-m", "shoal.cli", "serve", "--model-repository", str(repository)),
        *("--http-address", "127.0.0.1", "--http-port", "0", "--allow-grpc", "false"),
        *("--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1"),
        *("--allow-metrics", "false", *extra),
    ]
    wanted = {"http"} | {p for p in ("grpc", "metrics") if f"--allow-{p}" in extra}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, cwd=ROOT)
    assert process.stdout is not None
    urls: dict[str, str] = {}
    for raw in process.stdout:
        parts = raw.decode(errors="replace").split()
        if parts[:1] == ["SHOAL_LISTENING"] and len(parts) >= 4:
            urls[parts[1]] = f"127.0.0.1:{parts[3]}"
            if wanted <= urls.keys():
                break
    else:
        raise RuntimeError(f"shoal serve exited with {process.wait()} before listening")
    # Keep draining stdout, so a chatty server never blocks on a full pipe.
    threading.Thread(target=shutil.copyfileobj, args=(process.stdout, log), daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server_ready(urls["http"]):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_server(process)
            raise RuntimeError("shoal serve did not become ready")
        time.sleep(0.2)  # polling the readiness of a server we started
    return process, urls


def server_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def stop_server(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def counts(url: str, model: str) -> tuple[int, int]:
    """(execution_count, inference_count) of ``model`` from the statistics extension."""
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=10) as answer:
        stats = json.load(answer)["model_stats"][0]
    return int(stats["execution_count"]), int(stats["inference_count"])


def measure(url: str, model: str, concurrency: int, duration_s: float) -> Row:
    config = RunConfig(
        model=model,
        url=url,
        inputs=INPUT,
        concurrency=(concurrency,),
        duration_s=duration_s,
        warmup_s=1.0,
    )
    executions, inferences = counts(url, model)
    (result,) = run_loop(run(config))
    executions_after, inferences_after = counts(url, model)
    return Row(
        model == BATCHED, result, executions_after - executions, inferences_after - inferences
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| concurrency | dynamic batching | infer/s | p50 ms | p99 ms | exec/inference | errors |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        result = row.result
        lines.append(
            f"| {result.concurrency} | {'on' if row.batching else 'off'} | "
            f"{result.throughput:,.0f} | {result.latency_ms.p50:.2f} | "
            f"{result.latency_ms.p99:.2f} | {row.exec_per_inference:.3f} | {result.errors} |"
        )
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if "model name" in line)
    except (OSError, StopIteration):
        pass
    cores = len(os.sched_getaffinity(0))
    return f"{cpu}, {cores} cores usable by this process, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per cell")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--write", action="store_true", help=f"write {RESULT.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="shoal-batching-") as tmp:
        make_repository(Path(tmp))
        with open(Path(tmp) / "server.log", "wb") as log:
            process, url = start_server(Path(tmp), log)
            try:
                for concurrency in args.concurrency:
                    for model in (BATCHED, UNBATCHED):
                        rows.append(measure(url, model, concurrency, args.duration))
                        print(table(rows[-1:]).splitlines()[-1], flush=True)
            finally:
                stop_server(process)
    text = table(rows)
    print(text)
    if args.write:
        command = "python -m benchmarks.batching " + " ".join(argv or sys.argv[1:])
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(
            "# Dynamic batching on and off\n\n"
            f"* command: `{command.strip()}`\n* date: {when}\n* machine: {machine()}\n"
            f"* request: `INPUT0` FP32 `[1, 16]` over HTTP (binary tensors), {args.duration:g} s "
            "per cell after 1 s of warm-up, shoal.perf's closed-loop client\n\n"
            f"{text}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
