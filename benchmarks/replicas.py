"""shoal replicas behind a real haproxy: throughput, a killed replica, a rolling restart.

    .venv/bin/python -m benchmarks.replicas                  # 3 replicas, 10 s windows
    .venv/bin/python -m benchmarks.replicas --quick          # 2 replicas, 3 s windows
    .venv/bin/python -m benchmarks.replicas --markdown benchmarks/results/replicas.md

Replicas are ``shoal serve`` processes on loopback ports serving the bundled ``add_sub``; haproxy
(the Debian package) balances them round robin, checks ``/v2/health/ready`` every 200 ms and
retries refused, unanswered and 503 requests on another replica (tests/integration/haproxy.py
has the configuration). Three parts:

* (a) throughput with ``shoal perf`` against one replica directly, and through haproxy against
  1..N replicas;
* (b) SIGKILL of one replica under load: how many requests fail, against the bound (the requests
  haproxy lets one replica hold, ``maxconn``), with and without haproxy re-sending the requests
  the dead replica swallowed (``retry-on empty-response``);
* (c) a rolling restart (SIGTERM, drain, start on the same port, wait until haproxy sees it UP)
  of every replica under load: failed requests, and how long each step took.

The load in (b) and (c) is ``tritonclient.http`` threads that record every request.
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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.integration.haproxy import RETRY_ON, HAProxy, Load, LoadResult, Replicas, haproxy_binary

RETRY_NO_RESEND = "conn-failure 503"


def _perf(url: str, concurrency: int, seconds: float, client: str) -> dict[str, Any]:
    """One ``shoal perf`` cell against ``url``; its JSON record."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "perf.json"
        command = [sys.executable, "-m", "shoal.cli", "perf", "--url", url, "--model", "add_sub"]
        command += ["--concurrency", str(concurrency), "--duration", str(seconds)]
        command += ["--warmup", "1", "--client", client, "--json", str(out)]
        subprocess.run(command, check=False, stdout=subprocess.DEVNULL)
        record: dict[str, Any] = json.loads(out.read_text())["cells"][0]
    return record


def throughput(replicas: int, concurrency: int, seconds: float, client: str) -> list[str]:
    """(a): a markdown table, one row per target."""
    rows = ["| target | infer/s | p50 ms | p99 ms | errors |", "|---|---:|---:|---:|---:|"]
    print("\n".join(rows), flush=True)
    with Replicas(replicas) as group:
        targets: list[tuple[str, dict[str, int] | None]] = [("1 replica, direct", None)]
        for n in range(1, replicas + 1):
            names = list(group.ports)[:n]
            targets.append((f"haproxy → {n}", {k: group.ports[k] for k in names}))
        for label, servers in targets:
            if servers is None:
                record = _perf(group.servers["r0"].url, concurrency, seconds, client)
            else:
                with HAProxy(servers) as lb:
                    for name in servers:
                        lb.wait_for(name, "UP")
                    record = _perf(lb.url, concurrency, seconds, client)
            rows.append(
                f"| {label} | {record['throughput']:.0f} | {record['p50_ms']:.2f} "
                f"| {record['p99_ms']:.2f} | {record['errors']} |"
            )
            print(rows[-1], flush=True)
    return rows


def _rate(result: LoadResult, start: float, end: float) -> float:
    done = sum(1 for _, finished in result.ok if start <= finished < end)
    return done / max(end - start, 1e-9)


def kill(replicas: int, concurrency: int, seconds: float, retry_on: str) -> str:
    """(b): one row: failures against the bound, detection time, throughput before and after."""
    per_replica = max(1, concurrency // replicas)
    with (
        Replicas(replicas) as group,
        HAProxy(group.ports, maxconn=per_replica, retry_on=retry_on) as lb,
    ):
        for name in group.servers:
            lb.wait_for(name, "UP")
        load = Load(lb.url, concurrency).start()
        time.sleep(seconds)  # a load window, not a wait for readiness
        killed_at = time.monotonic()
        group.kill("r0")
        dead_at = time.monotonic()
        lb.wait_for("r0", "DOWN")
        down = time.monotonic() - killed_at
        time.sleep(seconds)
        result = load.stop()
    late = sum(1 for start, _, _ in result.failed if start > dead_at)
    before = _rate(result, killed_at - seconds, killed_at)
    after = _rate(result, killed_at + 1, killed_at + seconds)
    row = (
        f"| `{retry_on}` | {len(result.ok)} | {len(result.failed)} | {per_replica} | {late} "
        f"| {down * 1000:.0f} | {before:.0f} | {after:.0f} |"
    )
    print(row, flush=True)
    return row


def rolling_restart(replicas: int, concurrency: int, seconds: float) -> list[str]:
    """(c): per replica, how long the restart and the return to UP took; then the totals."""
    lines = ["| replica | exit code | SIGTERM → exited s | → started s | → haproxy UP s |"]
    lines.append("|---|---:|---:|---:|---:|")
    print("\n".join(lines), flush=True)
    with Replicas(replicas) as group, HAProxy(group.ports) as lb:
        for name in group.servers:
            lb.wait_for(name, "UP")
        load = Load(lb.url, concurrency).start()
        time.sleep(seconds)
        began = time.monotonic()
        for name in list(group.servers):
            started = time.monotonic()
            code = group.servers[name].stop(signal.SIGTERM)  # returns once it has exited
            exited = time.monotonic() - started
            group.restart(name)  # already stopped: starts it again on the same port
            restarted = time.monotonic() - started - exited
            up = lb.wait_for(name, "UP")
            lines.append(f"| {name} | {code} | {exited:.2f} | {restarted:.2f} | {up:.2f} |")
            print(lines[-1], flush=True)
        took = time.monotonic() - began
        time.sleep(seconds)
        result = load.stop()
    during = _rate(result, began, began + took)
    lines.append("")
    lines.append(
        f"Whole run: {len(result.ok)} requests succeeded, **{len(result.failed)} failed**; the "
        f"restart of all {replicas} replicas took {took:.1f} s, during which the load ran at "
        f"{during:.0f} infer/s (before: {_rate(result, began - seconds, began):.0f})."
    )
    for _, _, error in result.failed[:3]:
        lines.append(f"* failure: `{error[:160]}`")
    print(lines[-1], flush=True)
    return lines


def _machine() -> Iterator[str]:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    yield f"{len(os.sched_getaffinity(0))} cores ({cpu}), {platform.platform()}"
    yield f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    version = subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout
    yield version.splitlines()[0] if version else "haproxy: unknown version"


def _kills(args: argparse.Namespace) -> list[str]:
    header = [
        "",
        "## (b) SIGKILL of replica r0 under load",
        "",
        "| retry-on | ok | failed | maxconn | failed, sent after r0 was reaped "
        "| kill → DOWN ms | infer/s before | infer/s after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(header), flush=True)
    rows = list(header)
    for retry_on in (RETRY_NO_RESEND, RETRY_ON):
        rows.append(kill(args.replicas, args.concurrency, args.seconds, retry_on))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="each load window")
    parser.add_argument("--client", default="wrk" if shutil.which("wrk") else "python")
    parser.add_argument("--quick", action="store_true", help="2 replicas, 3 s windows")
    parser.add_argument("--parts", default="abc", help="which of (a), (b), (c) to run")
    parser.add_argument("--markdown", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    if haproxy_binary() is None:
        print("haproxy is not installed: apt-get install -y haproxy", file=sys.stderr)
        return 2
    if args.quick:
        args.replicas, args.seconds = 2, 3.0
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    report = [
        "# shoal replicas behind haproxy",
        "",
        f"`{' '.join(['python -m benchmarks.replicas', *(argv or sys.argv[1:])])}`, {now}",
        "",
        *(f"* {line}" for line in _machine()),
        f"* {args.replicas} replicas, model `add_sub`, concurrency {args.concurrency}, "
        f"{args.seconds:g} s windows",
    ]
    print("\n".join(report), flush=True)
    if "a" in args.parts:
        report += ["", f"## (a) Throughput (`shoal perf --client {args.client}`)", ""]
        print("\n".join(report[-3:]), flush=True)
        report += throughput(args.replicas, args.concurrency, args.seconds, args.client)
    if "b" in args.parts:
        report += _kills(args)
    if "c" in args.parts:
        header = ["", "## (c) Rolling restart under load (SIGTERM, drain, start)", ""]
        print("\n".join(header), flush=True)
        report += header
        report += rolling_restart(args.replicas, args.concurrency, args.seconds)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text("\n".join(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
