"""The stub process's own CPU per small request: one real stub, driven through its channel.

    .venv/bin/python -m benchmarks.stub_path [--requests 20000] [-c 8] [--rounds 3]
    .venv/bin/python -m benchmarks.stub_path --profile DIR      # cProfile of the stub
    .venv/bin/python -m benchmarks.stub_path --callgrind FILE   # instructions per request

Starts ``python -m shoal.stub`` on the device benchmark's model (``identity_x8``'s: each
request's 64-byte FP32 input copied into a new array and returned) and drives it the way the
core does, with no core: a minimal sender keeps ``-c`` Execute messages of one request each in
its ring (the input inline in the message, as the core sends a 64-byte tensor), reads each
Result and sends back a Release of its output block when it has one (a small output travels
inline in the Result and has none). The figure is the stub
process's CPU time (user + system, from ``/proc``) per request, and its context switches per
request: the driver's own work does not count, so the figure holds still on a busy machine
where the served benchmark (``benchmarks.overhead``) does not. The median of ``--rounds``.

``--callgrind FILE`` runs the stub under valgrind's callgrind and dumps its counts of the
measured requests alone (``callgrind_control``) to ``FILE.1``: instructions by C function
(``callgrind_annotate FILE.1``), the total per request printed.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import shoal._compiled
from shoal.ipc import messages as msg
from shoal.ipc._bell import drain_bell
from shoal.ipc.arena import Block, OwnedArena
from shoal.ipc.fdpass import send_fds
from shoal.ipc.queue import Channel
from shoal.ipc.tensor import InlineBytes, TensorDesc

#: The device benchmark's model (identity_fp32 / identity_x8 there).
MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.served = 0

    def execute(self, requests):
        out = []
        for req in requests:
            x = pb_utils.get_input_tensor_by_name(req, "INPUT0").as_numpy()
            y = np.array(x, dtype=np.float32, copy=True)
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", y)]))
        self.served += len(requests)
        return out
"""
CONFIG = {
    "name": "identity_fp32",
    "backend": "python",
    "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
}
INPUT_ARENA, OUTPUT_ARENA = 1, 2


@dataclass
class Usage:
    """CPU seconds and context switches of one process so far."""

    cpu_s: float
    switches: int

    @classmethod
    def of(cls, pid: int) -> Usage:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
        switches = 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.endswith("ctxt_switches:") or "ctxt_switches:" in line:
                switches += int(line.split()[1])
        return cls(cpu, switches)


class Driver:
    """The core's side of one stub, reduced to what a request needs."""

    def __init__(self, model_dir: Path, wrapper: list[str]) -> None:
        self.channel = Channel.create()
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.inputs = OwnedArena(INPUT_ARENA, initial_bytes=1 << 20, growth_bytes=1 << 20)
        fds = [child.fileno(), *self.channel.child_fds()]
        argv = [*wrapper, sys.executable, "-m", "shoal.stub", "--socket", str(fds[0])]
        argv += ["--channel", ",".join(str(fd) for fd in fds[1:])]
        argv += ["--parent", str(os.getpid()), "--instance", "identity_fp32_0"]
        self.proc = subprocess.Popen(argv, pass_fds=fds, stdin=subprocess.DEVNULL)
        child.close()
        for segment in self.inputs.segments:
            assert segment.fd is not None
            announce = msg.SegmentAnnounce(segment.arena_id, segment.index, segment.size)
            send_fds(self.sock, announce.encode(), [segment.fd])
        self._poller = select.poll()
        self._poller.register(self.channel.child_fds()[3], select.POLLIN)  # the up bell
        self._key = 0
        self._initialize(model_dir)

    def _initialize(self, model_dir: Path) -> None:
        args = {"model_config": json.dumps(CONFIG), "model_name": "identity_fp32"}
        args |= {"model_instance_kind": "CPU", "model_instance_name": "identity_fp32_0"}
        model_file = str(model_dir / "1" / "model.py")
        init = msg.Initialize(args, model_file, OUTPUT_ARENA, (1 << 20, 1 << 20, 1 << 26))
        self._send(init)
        ready = self._receive()
        if not isinstance(ready, msg.Ready) or ready.error:
            raise RuntimeError(f"the stub did not start: {ready}")

    def _send(self, message: msg.Message) -> None:
        if not self.channel.send_down_nowait(msg.encode(message)):
            raise RuntimeError("the down ring is full")

    def _receive(self) -> msg.Message:
        while (payload := self.channel.recv_up_nowait()) is None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the stub exited with {self.proc.returncode}")
            if self._poller.poll(1000):
                drain_bell(self.channel.child_fds()[3])
        return msg.decode(payload)

    def _execute(self, block: Block) -> None:
        self._key += 1
        location = InlineBytes(bytes(self.inputs.view(block)))  # as the core stages 64 bytes
        desc = TensorDesc("INPUT0", "FP32", (16,), location)
        record = msg.RequestRecord("", 0, 0, {}, [], [desc], key=self._key)
        self._send(msg.Execute(self._key, [record]))

    def run(self, total: int, concurrency: int) -> None:
        """``total`` requests, ``concurrency`` of them in the ring at once."""
        blocks = [self.inputs.allocate(64) for _ in range(concurrency)]
        for block in blocks:
            self.inputs.view(block)[:] = np.arange(16, dtype=np.float32).tobytes()
        free = list(blocks)
        sent = done = 0
        by_batch: dict[int, Block] = {}
        while done < total:
            while free and sent < total:
                block = free.pop()
                self._execute(block)
                by_batch[self._key] = block
                sent += 1
            result = self._receive()
            assert isinstance(result, msg.Result), result
            # a Result in its whole form (every output inline) carries each record undecoded
            outputs = [d.location for r in result.responses for d in r.outputs]
            whole = result.wholes is not None and len(result.wholes) == 1
            assert whole or (len(outputs) == 1 and not result.responses[0].error), result
            blocks = [o for o in outputs if type(o) is Block]
            if blocks:
                self._send(msg.Release(blocks))
            free.append(by_batch.pop(result.batch_id))
            done += 1

    def close(self) -> None:
        try:
            self._send(msg.Finalize())
            while not isinstance(self._receive(), msg.Finalized):
                pass
        finally:
            self.proc.wait(timeout=60)
            self.channel.close()
            self.sock.close()
            self.inputs.close()


def _callgrind_wrapper(out: str) -> list[str]:
    return [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
    ]


def _callgrind(pid: int, option: str) -> None:
    subprocess.run(["callgrind_control", option, str(pid)], check=True, capture_output=True)


def _instructions(path: str) -> int:
    """The total of a callgrind output file (its ``summary:``/``totals:`` line)."""
    for line in Path(path).read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def measure(options: argparse.Namespace, model_dir: Path) -> None:
    wrapper = _callgrind_wrapper(options.callgrind) if options.callgrind else []
    driver = Driver(model_dir, wrapper)
    try:
        driver.run(max(options.requests // 10, 100), options.concurrency)  # warm-up
        if options.callgrind:
            _callgrind(driver.proc.pid, "--zero")
            driver.run(options.requests, options.concurrency)
            _callgrind(driver.proc.pid, "--dump")
        else:
            _rounds(driver, options)
    finally:
        driver.close()
    if options.callgrind:
        counted = options.callgrind + ".1"  # the first dump: the measured requests
        per = _instructions(counted) / options.requests
        print(f"callgrind: {per:,.0f} instructions per request ({counted})")


def _rounds(driver: Driver, options: argparse.Namespace) -> None:
    cpu: list[float] = []
    switches: list[float] = []
    for _ in range(options.rounds):
        before = Usage.of(driver.proc.pid)
        started = time.perf_counter()
        driver.run(options.requests, options.concurrency)
        wall = time.perf_counter() - started
        after = Usage.of(driver.proc.pid)
        cpu.append((after.cpu_s - before.cpu_s) / options.requests * 1e6)
        switches.append((after.switches - before.switches) / options.requests)
        print(
            f"  round: {cpu[-1]:6.1f} µs CPU/req, {switches[-1]:.2f} switches/req, "
            f"{options.requests / wall:,.0f} req/s",
            flush=True,
        )
    print(
        f"stub, hot path {shoal._compiled.state}, c={options.concurrency}: "
        f"{statistics.median(cpu):.1f} µs CPU per request, "
        f"{statistics.median(switches):.2f} context switches per request"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", metavar="DIR", help="write the stub's cProfile stats here")
    parser.add_argument("--callgrind", metavar="FILE", help="run the stub under callgrind")
    options = parser.parse_args()
    if options.profile:
        os.environ["SHOAL_STUB_PROFILE"] = options.profile
    with tempfile.TemporaryDirectory(prefix="shoal-stub-path-") as tmp:
        model_dir = Path(tmp) / "identity_fp32"
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "1" / "model.py").write_text(MODEL)
        measure(options, model_dir)


if __name__ == "__main__":
    main()
