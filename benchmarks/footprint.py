"""What a server with N frontend workers holds: memory, fds, shared segments, threads.

    .venv/bin/python -m benchmarks.footprint                        # N = 1, 2, 4, 7
    .venv/bin/python -m benchmarks.footprint --workers 7 --requests 20000 --bytes 4096

Serves a copy of the device bench's repository (``identity_fp32`` with 2 instances, and
``identity_x8``: the same model with 8) and, for each N, measures once when the server is ready
and once after ``--requests`` requests of ``--bytes`` (64 B) over new HTTP connections, half to
each model (so every worker has taken some, and made its direct routes to every stub of both;
4 KiB requests, inline in the rings, wrap each ring after a few hundred):

* time to ready (start to ``/v2/health/ready``, every model loaded);
* per role (core, workers, stubs): processes, RSS and PSS (``/proc/PID/smaps_rollup``), open fds,
  threads;
* memfd segments: how many distinct ones exist (by inode, over every process's fds and maps),
  their total size and the pages they really hold (``st_blocks``), by name (channels, arenas,
  counters), and how many mappings of them the processes hold.

PSS counts a page shared by k processes as 1/k in each, so the PSS sum is the memory the server
really uses; the RSS sum counts shared pages once per process that touched them.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import http.client
import json
import os
import platform
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

DEVICE_REPO = Path("/work/shared/device-bench/model_repository")
_LISTENING = re.compile(r"^SHOAL_LISTENING http .* (\d+)$", re.M)


def make_repository(into: Path, source: Path) -> Path:
    """``source`` copied, with ``identity_x8`` (``identity_fp32`` with 8 instances) added, as
    the device bench does."""
    repo = into / "model_repository"
    shutil.copytree(source, repo)
    for path in repo.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    x8 = repo / "identity_x8"
    shutil.copytree(repo / "identity_fp32", x8)
    config = (x8 / "config.pbtxt").read_text().replace('"identity_fp32"', '"identity_x8"')
    (x8 / "config.pbtxt").write_text(config.replace("count: 2", "count: 8"))
    return repo


def tree(root: int) -> list[int]:
    """``root`` and every process under it."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children[ppid].append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def role(pid: int, core: int) -> str:
    if pid == core:
        return "core"
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return "stub" if b"shoal.stub" in args else "worker"


def _rollup(pid: int) -> dict[str, int]:
    """``smaps_rollup``'s figures, in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0])
    return fields


def _segment_kind(name: str) -> str:
    name = name.removeprefix("/memfd:").removesuffix(" (deleted)")
    return re.sub(r"-\d+", "", name)


def process_figures(pid: int, segments: dict[int, tuple[str, int, int]]) -> dict[str, Any]:
    """One process's figures; the memfd segments it holds (fd or map) go into ``segments``
    (inode -> kind, size, bytes held)."""
    rollup = _rollup(pid)
    fds = os.listdir(f"/proc/{pid}/fd")
    threads = len(os.listdir(f"/proc/{pid}/task"))
    memfd_fds = 0
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if not target.startswith("/memfd:"):
                continue
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        memfd_fds += 1
        segments[st.st_ino] = (_segment_kind(target), st.st_size, st.st_blocks * 512)
    maps = 0
    mapped: set[int] = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/memfd:"):
            maps += 1
            mapped.add(int(parts[4]))
    return {
        "rss_kib": rollup["Rss"],
        "pss_kib": rollup["Pss"],
        "pss_anon_kib": rollup["Pss_Anon"],
        "pss_shmem_kib": rollup["Pss_Shmem"],
        "fds": len(fds),
        "memfd_fds": memfd_fds,
        "memfd_maps": maps,
        "memfd_mapped": len(mapped),
        "threads": threads,
    }


def snapshot(core: int) -> dict[str, Any]:
    """Figures per role, and the segments."""
    segments: dict[int, tuple[str, int, int]] = {}
    roles: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for pid in tree(core):
        try:
            roles[role(pid, core)].append(process_figures(pid, segments))
        except OSError:
            continue  # gone meanwhile
    kinds: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for kind, size, held in segments.values():
        kinds[kind][0] += 1
        kinds[kind][1] += size
        kinds[kind][2] += held
    return {"roles": dict(roles), "segments": dict(kinds)}


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, ConnectionError):
        return False


def _infer(port: int, model: str, nbytes: int) -> None:
    """One request of ``nbytes`` (fp32) on a new connection, in the binary tensor extension."""
    count = nbytes // 4
    tensor = struct.pack(f"<{count}f", *range(count))
    head = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [count]}]}
    head["inputs"][0]["parameters"] = {"binary_data_size": len(tensor)}
    head_bytes = json.dumps(head).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            "POST",
            f"/v2/models/{model}/infer",
            body=head_bytes + tensor,
            headers={"Inference-Header-Content-Length": str(len(head_bytes))},
        )
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"{model}: HTTP {response.status}")
    finally:
        conn.close()


def measure(repo: Path, workers: int, load: tuple[int, int], timeout: float) -> dict[str, Any]:
    """Serve ``repo`` with ``workers`` frontend workers; the figures ready and after the load."""
    with tempfile.TemporaryDirectory(prefix="shoal-footprint-") as tmp:
        log = Path(tmp) / "serve.log"
        with log.open("wb") as out:
            return _serve(repo, workers, load, timeout, out, log)


def _serve(
    repo: Path, workers: int, load: tuple[int, int], timeout: float, out: Any, log: Path
) -> dict[str, Any]:
    args = [sys.executable, "-m", "shoal.cli", "serve", "--model-repository", str(repo)]
    args += ["--http-address", "127.0.0.1", "--http-port", "0", "--allow-grpc", "false"]
    args += ["--allow-metrics", "false", "--frontend-workers", str(workers)]
    started = time.monotonic()
    proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = started + timeout
        port = 0
        while time.monotonic() < deadline and proc.poll() is None:
            if not port:
                found = _LISTENING.search(log.read_text(errors="replace"))
                port = int(found.group(1)) if found else 0
            if port and _ready(port):
                break
            time.sleep(0.02)  # polling for readiness, not waiting on time
        else:
            raise RuntimeError(f"not ready:\n{log.read_text(errors='replace')}")
        ready_s = time.monotonic() - started
        at_ready = snapshot(proc.pid)
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            requests, nbytes = load
            models = ["identity_x8", "identity_fp32"] * (requests // 2)
            list(pool.map(lambda m: _infer(port, m, nbytes), models))
        after = snapshot(proc.pid)
        return {"workers": workers, "ready_s": ready_s, "ready": at_ready, "loaded": after}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _sum(figures: list[dict[str, Any]], key: str) -> int:
    return sum(int(f[key]) for f in figures)


def rows(result: dict[str, Any], when: str) -> list[str]:
    """Markdown rows: one per role, then the segments."""
    snap = result[when]
    out = []
    for name in ("core", "worker", "stub"):
        figures = snap["roles"].get(name, [])
        if not figures:
            continue
        out.append(
            f"| {result['workers']} | {when} | {name} x{len(figures)} "
            f"| {_sum(figures, 'rss_kib') / 1024:.0f} | {_sum(figures, 'pss_kib') / 1024:.0f} "
            f"| {_sum(figures, 'pss_anon_kib') / 1024:.0f} "
            f"| {_sum(figures, 'pss_shmem_kib') / 1024:.0f} "
            f"| {max(f['fds'] for f in figures)} | {max(f['memfd_maps'] for f in figures)} "
            f"| {max(f['threads'] for f in figures)} |"
        )
    return out


def segment_rows(result: dict[str, Any], when: str) -> list[str]:
    out = []
    for kind, (count, size, held) in sorted(result[when]["segments"].items()):
        out.append(
            f"| {result['workers']} | {when} | {kind} | {count} | {size / 2**20:.1f} "
            f"| {held / 2**20:.1f} |"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 7])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--bytes", type=int, default=64, help="each request's tensor")
    parser.add_argument("--repository", type=Path, default=DEVICE_REPO)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path, help="write every figure there too")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-footprint-") as tmp:
        repo = make_repository(Path(tmp), opts.repository)
        load = (opts.requests, opts.bytes)
        results = [measure(repo, n, load, opts.timeout) for n in opts.workers]
    print(
        f"# {platform.node()}, {os.cpu_count()} cores, {opts.requests} requests of "
        f"{opts.bytes} B, shoal serve"
    )
    print("| N | ready s |")
    print("|---:|---:|")
    for r in results:
        print(f"| {r['workers']} | {r['ready_s']:.1f} |")
    print(
        "\n| N | when | role | RSS MiB | PSS MiB | PSS anon MiB | PSS shmem MiB | fds (max) "
        "| memfd maps (max) | threads (max) |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print("\n".join(rows(r, "ready") + rows(r, "loaded")))
    print("\n| N | when | segment | count | size MiB | held MiB |")
    print("|---:|---|---|---:|---:|---:|")
    for r in results:
        print("\n".join(segment_rows(r, "ready") + segment_rows(r, "loaded")))
    if opts.json:
        opts.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
