"""The supervisor-side faults of issue #23 (classes E, G, H, I), repeated against a real
``shoal serve``: what each costs and what it leaves behind.

    .venv/bin/python -m benchmarks.supervisor_faults                  # every fault
    .venv/bin/python -m benchmarks.supervisor_faults shm shutdown     # some of them

* ``shm`` (G): rounds of register / shrink the object / send a BYTES input, an FP32 input and an
  output window from it; counts the answers by status, the supervisor and stub deaths, and the
  supervisor's fds and ``/dev/shm`` segments after.
* ``restart`` (E): the supervisor's fd limit lowered to 3, its stub killed: how long until a
  request is refused, then, the limit restored, how long until the model is ready again.
* ``shutdown`` (H): SIGTERM with a request that never finishes, ``--exit-timeout-secs 5``.
* ``repository`` (I): the repository-API inputs that used to be 500: their statuses.

Results go to docs/hardening.md with the machine they ran on.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.conftest import shoal_shm_segments
from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _status(call: Callable[[], object]) -> str:
    try:
        call()
    except InferenceServerException as error:
        return str(error.status())
    except Exception as error:  # the server went away: what the client saw
        return type(error).__name__
    return "200"


def shm_rounds(rounds: int) -> str:
    key = f"/shoal_bench_truncated_{os.getpid()}"
    segments = shoal_shm_segments()
    statuses: Counter[str] = Counter()
    with ShoalServer(BUNDLED) as server:
        client = httpclient.InferenceServerClient(server.url)
        stubs = server.stub_pids()
        fds = _fds(server.proc.pid)
        data = serialize_byte_tensor(np.array([b"hello", b"world"], dtype=object))
        text = httpclient.InferInput("TEXT", [1, 2], "BYTES")
        text.set_shared_memory("r", len(data.item()))
        fp32 = httpclient.InferInput("IN_FP32", [16], "FP32")
        fp32.set_shared_memory("r", 64)
        plain = httpclient.InferInput("IN_FP32", [16], "FP32")
        plain.set_data_from_numpy(np.arange(16, dtype=np.float32))
        out = httpclient.InferRequestedOutput("OUT_FP32")
        out.set_shared_memory("r", 64)
        calls = [
            lambda: client.infer("string_upper", [text]),
            lambda: client.infer("identity", [fp32]),
            lambda: client.infer("identity", [plain], outputs=[out]),
        ]
        for n in range(rounds):
            handle = shm.create_shared_memory_region("r", key, 64)
            try:
                shm.set_shared_memory_region(handle, [data])
                client.register_system_shared_memory("r", key, 64)
                os.truncate(f"/dev/shm{key}", (0, 8, 32)[n % 3])
                statuses[_status(calls[n % 3])] += 1
                client.unregister_system_shared_memory("r")
            finally:
                shm.destroy_shared_memory_region(handle)
            if server.proc.poll() is not None:
                break
        alive = server.proc.poll() is None
        stub_deaths = len(stubs - server.stub_pids()) if alive else len(stubs)
        fd_growth = _fds(server.proc.pid) - fds if alive else 0
        client.close()
    # Only this run's: other processes on the machine may create segments meanwhile.
    mine = ("bench", str(server.proc.pid))
    leaked = {name for name in shoal_shm_segments() - segments if any(m in name for m in mine)}
    return (
        f"shm: {rounds} rounds: statuses {dict(statuses)}; supervisor deaths {int(not alive)}, "
        f"stub deaths {stub_deaths}, supervisor fd growth {fd_growth}, "
        f"/dev/shm segments left {len(leaked)}"
    )


def _hang_input() -> grpcclient.InferInput:
    inp = grpcclient.InferInput("HANG", [1], "INT32")
    inp.set_data_from_numpy(np.array([0], dtype=np.int32))
    return inp


def restart(outage: float) -> str:
    args = ("--model-control-mode", "explicit", "--load-model", "hang")
    with ShoalServer(TEST_MODELS, extra_args=args) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        client.infer("hang", [_hang_input()])
        pid = server.proc.pid
        fds = _fds(pid)
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (3, hard))
        try:
            (stub,) = server.stub_pids()
            killed = time.monotonic()
            os.kill(stub, signal.SIGKILL)
            while "restart 1 failed" not in server.output:
                time.sleep(0.01)
            failed_after = time.monotonic() - killed
            started = time.monotonic()
            status = _status(lambda: client.infer("hang", [_hang_input()], client_timeout=30))
            refused_in = time.monotonic() - started
            ready_during = client.is_model_ready("hang")
            time.sleep(outage)  # the cause lasts this long
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        restored = time.monotonic()
        while not client.is_model_ready("hang"):
            time.sleep(0.01)
        back_in = time.monotonic() - restored
        answered = _status(lambda: client.infer("hang", [_hang_input()]))
        fd_growth = _fds(pid) - fds
        failures = server.output.count("has no live stub: restart")
        client.close()
    return (
        f"restart: first failed restart logged {failed_after:.2f}s after the kill; a request "
        f"during the outage: {status} in {refused_in * 1000:.0f} ms; model ready during it: "
        f"{ready_during}; {failures} failed restarts logged in a {outage:g}s outage; ready "
        f"{back_in:.2f}s after the cause went, then {answered}; supervisor fd growth {fd_growth}"
    )


def shutdown(exit_timeout: float, rounds: int) -> str:
    took: list[float] = []
    for _ in range(rounds):
        args = ("--exit-timeout-secs", str(exit_timeout), "--model-control-mode", "explicit")
        args += ("--load-model", "slow", "--load-model", "init_args")
        server = ShoalServer(TEST_MODELS, extra_args=args).start()
        client = httpclient.InferenceServerClient(server.url, network_timeout=300)
        inp = httpclient.InferInput("SECONDS", [1], "FP32")
        inp.set_data_from_numpy(np.array([600.0], dtype=np.float32))
        caller = threading.Thread(
            target=_status, args=(lambda c=client, i=inp: c.infer("slow", [i]),)
        )
        caller.start()
        while "slow: executing" not in server.output:
            time.sleep(0.01)
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(120)
        took.append(time.monotonic() - started)
        server.stop()  # the server has exited: checks that no stub outlived it
        caller.join(30)
        server.__exit__(None, None, None)
    return (
        f"shutdown: --exit-timeout-secs {exit_timeout:g} with a hung request: SIGTERM to exit "
        f"{min(took):.2f}-{max(took):.2f}s over {rounds} runs"
    )


def repository() -> str:
    model = b"class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
    config = json.dumps(
        {
            "backend": "python",
            "input": [{"name": "I", "data_type": "TYPE_INT32", "dims": [1]}],
            "output": [{"name": "O", "data_type": "TYPE_INT32", "dims": [1]}],
        }
    )
    cases = {
        "file:.": ("m", {"file:.": model}),
        "file:1/": ("m", {"file:1/": model, "file:1/model.py": model}),
        "NUL": ("m", {"file:1/mo\0del.py": model}),
        "file and directory": ("m", {"file:1": model, "file:1/model.py": model}),
        "long name": ("n" * 300, {"file:1/model.py": model}),
        "long file name": ("m", {"file:1/" + "a" * 300: model}),
        "long path": ("m", {"file:" + "/".join(["a" * 200] * 30): model}),
    }
    scratch = set(glob.glob(f"{tempfile.gettempdir()}/shoal-model-*"))
    args = ("--model-control-mode", "explicit")
    with ShoalServer(TEST_MODELS, extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        answers = {}
        for label, (name, files) in cases.items():
            answers[label] = _status(
                lambda n=name, f=files: client.load_model(n, config=config, files=f)  # type: ignore[misc]
            )
        client.close()
    left = set(glob.glob(f"{tempfile.gettempdir()}/shoal-model-*")) - scratch
    return f"repository: {answers}; scratch directories left {len(left)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("faults", nargs="*", default=["shm", "restart", "shutdown", "repository"])
    parser.add_argument("--shm-rounds", type=int, default=60)
    args = parser.parse_args()
    for fault in args.faults:
        if fault == "shm":
            print(shm_rounds(args.shm_rounds), flush=True)
        elif fault == "restart":
            print(restart(outage=10.0), flush=True)
        elif fault == "shutdown":
            print(shutdown(exit_timeout=5.0, rounds=3), flush=True)
        elif fault == "repository":
            print(repository(), flush=True)
        else:
            parser.error(f"unknown fault '{fault}'")


if __name__ == "__main__":
    main()
