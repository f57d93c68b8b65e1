"""Driving ``wrk`` (HTTP) and ``h2load`` (gRPC over HTTP/2) with the pre-serialised request.

Both are native clients (Debian packages ``wrk`` and ``nghttp2-client``): far lighter than any
Python client, so more of the machine is left to the server. Their CPU time is read from
``getrusage(RUSAGE_CHILDREN)`` around the measured run.
"""

from __future__ import annotations

import asyncio
import re
import resource
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from shoal.perf.errors import PerfError
from shoal.perf.requests import grpc_frame
from shoal.perf.stats import LatencySummary

_WRK_SCRIPT = """\
wrk.method = "POST"
wrk.headers["Content-Type"] = "{content_type}"
{extra_headers}
local f = assert(io.open("{body_path}", "rb"))
wrk.body = f:read("*a")
f:close()
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "SHOAL_PERF requests=%d errors=%d p50=%d p90=%d p99=%d mean=%f min=%d max=%d\\n",
    summary.requests, e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, latency.min, latency.max))
end
"""

_WRK_LINE = re.compile(
    r"SHOAL_PERF requests=(\d+) errors=(\d+) p50=(\d+) p90=(\d+) p99=(\d+) "
    r"mean=([\d.]+) min=(\d+) max=(\d+)"
)


@dataclass(frozen=True)
class ExternalResult:
    requests: int
    errors: int
    duration_s: float
    latency_ms: LatencySummary
    cpu_seconds: float


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        package = "nghttp2-client" if tool == "h2load" else tool
        raise PerfError(f"{tool} is not installed (apt-get install {package})")
    return path


async def _run(args: list[str]) -> tuple[str, float]:
    """Run a tool; return its stdout and the CPU seconds it used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await process.communicate()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = output.decode(errors="replace")
    if process.returncode != 0:
        raise PerfError(f"{args[0]} exited with {process.returncode}:\n{text[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return text, cpu


def wrk_script(raw_request: bytes, body_path: Path) -> str:
    """The Lua script that makes wrk send ``raw_request``'s body with its headers."""
    headers = _headers(raw_request)
    return _WRK_SCRIPT.format(
        content_type=headers.get("Content-Type", "application/octet-stream"),
        extra_headers=_lua_headers(headers),
        body_path=str(body_path),
    )


def _headers(raw_request: bytes) -> dict[str, str]:
    head, _, _ = raw_request.partition(b"\r\n\r\n")
    lines = head.decode("ascii").split("\r\n")[1:]
    return {key: value for key, _, value in (line.partition(": ") for line in lines)}


def _lua_headers(headers: dict[str, str]) -> str:
    """The headers wrk does not set itself, as lines of its Lua script."""
    skipped = ("Host", "Content-Type", "Content-Length")
    lines = (f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items() if k not in skipped)
    return "\n".join(lines)


def parse_wrk(output: str, duration_s: float, cpu_seconds: float) -> ExternalResult:
    match = _WRK_LINE.search(output)
    if match is None:
        raise PerfError(f"no summary in wrk's output:\n{output[-2000:]}")
    requests, errors = int(match[1]), int(match[2])
    us = [float(match[i]) / 1000 for i in range(3, 9)]
    latency = LatencySummary(p50=us[0], p90=us[1], p99=us[2], mean=us[3], min=us[4], max=us[5])
    return ExternalResult(max(requests - errors, 0), errors, duration_s, latency, cpu_seconds)


async def run_wrk(
    url: str, path: str, raw_request: bytes, concurrency: int, warmup_s: float, duration_s: float
) -> ExternalResult:
    wrk = require("wrk")
    with tempfile.TemporaryDirectory(prefix="shoal-perf-") as folder:
        script = _write_wrk_files(Path(folder), raw_request)
        base = [wrk, "-t", "1", "-c", str(concurrency), "--timeout", "30s", "-s", str(script)]
        if warmup_s > 0:
            await _run([*base, "-d", f"{max(1, round(warmup_s))}s", f"http://{url}{path}"])
        seconds = max(1, round(duration_s))
        output, cpu = await _run([*base, "-d", f"{seconds}s", f"http://{url}{path}"])
    return parse_wrk(output, float(seconds), cpu)


_H2LOAD_REQUESTS = re.compile(
    r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed"
)


def _write_wrk_files(folder: Path, raw_request: bytes) -> Path:
    body_path = folder / "body"
    body_path.write_bytes(raw_request.partition(b"\r\n\r\n")[2])
    script = folder / "request.lua"
    script.write_text(wrk_script(raw_request, body_path))
    return script


def parse_h2load(output: str, log: str) -> tuple[int, int, list[int]]:
    """Successful and failed requests (h2load's summary) and the latencies (ns) of the streams
    logged with HTTP 200.

    The counts come from the summary, not the log: h2load records a response's status only when
    its headers arrive in the measured phase, so a request whose headers came during the warm-up
    and whose stream ended after it is logged with status 0 although it succeeded (its logged
    time is not a whole request's either, so it is left out of the latencies). A reset or
    refused stream is in the summary's ``failed``.
    """
    match = _H2LOAD_REQUESTS.search(output)
    if match is None:
        raise PerfError(f"no summary in h2load's output:\n{output[-2000:]}")
    return int(match[1]), int(match[2]), _ok_latencies(log)


def _ok_latencies(log: str) -> list[int]:
    """The latencies (ns) of the streams h2load logged with HTTP 200."""
    rows = [line.split("\t") for line in log.splitlines()]
    return [int(row[2]) * 1000 for row in rows if len(row) >= 3 and row[1] == "200"]


async def run_h2load(
    url: str, method_path: str, message: bytes, concurrency: int, warmup_s: float, duration_s: float
) -> ExternalResult:
    """gRPC unary calls by h2load. It sees HTTP statuses only: a gRPC error status (sent in the
    trailers of an HTTP 200) counts as a success, so check errors with the built-in client."""
    h2load = require("h2load")
    with tempfile.TemporaryDirectory(prefix="shoal-perf-") as folder:
        body_path, log_path = Path(folder) / "body", Path(folder) / "log"
        body_path.write_bytes(grpc_frame(message))
        args = [
            h2load,
            "-c",
            str(concurrency),
            "-m",
            "1",
            "-t",
            "1",
            "-D",
            f"{round(duration_s * 1000)}ms",
        ]
        if warmup_s > 0:
            args += [f"--warm-up-time={round(warmup_s * 1000)}ms"]
        args += ["-d", str(body_path), "--log-file", str(log_path)]
        args += ["-H", "content-type: application/grpc", "-H", "te: trailers"]
        output, cpu = await _run([*args, f"http://{url}{method_path}"])
        succeeded, failed, latencies = parse_h2load(output, log_path.read_text())
    latency = LatencySummary.of(latencies)
    cpu_share = cpu * duration_s / (duration_s + warmup_s)
    return ExternalResult(succeeded, failed, duration_s, latency, cpu_share)
