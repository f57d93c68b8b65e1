"""The same tritonclient calls against shoal and the real Triton server, answers compared.

    .venv/bin/python -m benchmarks.triton_diff    # OK / DIFF per call; exit 1 on a DIFF

Both servers serve one repository assembled from the bundled models, the benchmark models and a
few test models, in explicit mode with every model loaded (Triton from ``.bench-venv``, as
``benchmarks.compare`` installs it). Each call goes to both; the status (HTTP code or gRPC status
code) and the answer (JSON with counters and timings blanked, or the error text) must be equal,
except that shoal's error text may go on after Triton's (to say what to do about it).
Differences shoal keeps on purpose are listed in ``KNOWN`` and reported as such, not as DIFFs
(docs/http.md and docs/grpc.md, "Differences from Triton"). The servers' logs go to
``benchmarks/results/triton_diff-{triton,shoal}.log``.
"""

from __future__ import annotations

import http.client
import json
import queue
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from benchmarks import compare

ROOT = compare.ROOT
TEST_MODELS = ("error_response", "raiser", "seq_direct", "decoupled_repeat")
#: Counters and timings that differ between any two runs.
VOLATILE = {"ns", "count", "last_inference", "inference_count", "execution_count", "timestamp"}

#: Calls whose answers differ on purpose: Triton answers 500 for the client's mistakes.
KNOWN = {
    "infer: data of the wrong JSON type",
    "infer: body is not JSON",
    "infer: fewer data elements than the shape",
    "load: an unknown model",
}

F = [1.0, 2.0, 3.0, 4.0]


def _tensor(name: str, shape: list[int], datatype: str, data: list[Any]) -> dict[str, Any]:
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


def _add_sub(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [_tensor("INPUT0", [4], "FP32", F), _tensor("INPUT1", [4], "FP32", F)]
    }
    body.update(extra)
    return body


#: (label, method, path, body) over HTTP.
HTTP_CALLS: list[tuple[str, str, str, Any]] = [
    ("health", "GET", "/v2/health/ready", None),
    ("metadata", "GET", "/v2/models/add_sub", None),
    ("metadata: missing version", "GET", "/v2/models/add_sub/versions/7", None),
    ("config", "GET", "/v2/models/add_sub/config", None),
    ("config: ensemble", "GET", "/v2/models/ensemble_add_sub/config", None),
    ("statistics: missing version", "GET", "/v2/models/add_sub/versions/7/stats", None),
    ("infer", "POST", "/v2/models/add_sub/infer", _add_sub()),
    (
        "infer: missing input",
        "POST",
        "/v2/models/add_sub/infer",
        {"inputs": [_tensor("INPUT0", [4], "FP32", F)]},
    ),
    (
        "infer: wrong datatype",
        "POST",
        "/v2/models/add_sub/infer",
        {
            "id": "r1",
            "inputs": [
                _tensor("INPUT0", [4], "INT32", [1, 2, 3, 4]),
                _tensor("INPUT1", [4], "FP32", F),
            ],
        },
    ),
    (
        "infer: wrong shape",
        "POST",
        "/v2/models/add_sub/infer",
        {"inputs": [_tensor("INPUT0", [2, 2], "FP32", F), _tensor("INPUT1", [4], "FP32", F)]},
    ),
    (
        "infer: shape without batch dimension",
        "POST",
        "/v2/models/string_upper/infer",
        {"inputs": [_tensor("TEXT", [2], "BYTES", ["a", "b"])]},
    ),
    (
        "infer: unknown output",
        "POST",
        "/v2/models/add_sub/infer",
        _add_sub(outputs=[{"name": "NOPE"}]),
    ),
    (
        "infer: classification",
        "POST",
        "/v2/models/add_sub/infer",
        _add_sub(outputs=[{"name": "OUTPUT0", "parameters": {"classification": 3}}]),
    ),
    (
        "infer: classification of a batch",
        "POST",
        "/v2/models/string_upper/infer",
        {
            "inputs": [_tensor("TEXT", [2, 3], "BYTES", ["a", "bbb", "cc", "dddd", "e", "ff"])],
            "outputs": [{"name": "LENGTH", "parameters": {"classification": 2}}],
        },
    ),
    (
        "infer: decoupled model",
        "POST",
        "/v2/models/token_streamer/infer",
        {"inputs": [_tensor("COUNT", [1], "INT32", [2])]},
    ),
    (
        "infer: data of the wrong JSON type",
        "POST",
        "/v2/models/add_sub/infer",
        {
            "inputs": [
                _tensor("INPUT0", [4], "FP32", ["a", "b", "c", "d"]),
                _tensor("INPUT1", [4], "FP32", F),
            ]
        },
    ),
    ("infer: body is not JSON", "POST", "/v2/models/add_sub/infer", b"{not json"),
    (
        "infer: fewer data elements than the shape",
        "POST",
        "/v2/models/add_sub/infer",
        {"inputs": [_tensor("INPUT0", [4], "FP32", F[:3]), _tensor("INPUT1", [4], "FP32", F)]},
    ),
    ("generate", "POST", "/v2/models/add_sub/generate", {"INPUT0": F, "INPUT1": F}),
    ("generate_stream", "POST", "/v2/models/token_streamer/generate_stream", {"COUNT": 2}),
    ("trace settings", "GET", "/v2/trace/setting", None),
    (
        "trace: a level without a trace file",
        "POST",
        "/v2/trace/setting",
        {"trace_level": ["TIMESTAMPS"]},
    ),
    ("logging", "GET", "/v2/logging", None),
    ("shared memory: status", "GET", "/v2/systemsharedmemory/status", None),
    (
        "repository: unload a model never loaded",
        "POST",
        "/v2/repository/models/never_heard_of/unload",
        {},
    ),
    ("load: an unknown model", "POST", "/v2/repository/models/never_heard_of/load", {}),
    ("repository: unload a step model", "POST", "/v2/repository/models/add_sub/unload", {}),
    ("repository: index after it", "POST", "/v2/repository/index", {}),
    ("infer: an unloaded model", "POST", "/v2/models/add_sub/infer", _add_sub()),
    ("repository: load it again", "POST", "/v2/repository/models/add_sub/load", {}),
    ("repository: index again", "POST", "/v2/repository/index", {}),
]


def _blank(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "*" if k in VOLATILE else _blank(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank(v) for v in value]
    return value


def _same(theirs: Any, ours: Any) -> bool:
    """Equal, or shoal's error text is Triton's followed by more (what to do about it)."""
    if theirs == ours:
        return True
    if isinstance(theirs, tuple) and isinstance(ours, tuple) and len(theirs) == len(ours):
        return all(_same(t, o) for t, o in zip(theirs, ours, strict=True))
    if isinstance(theirs, dict) and isinstance(ours, dict) and set(theirs) == {"error"}:
        return set(ours) == {"error"} and _same(theirs["error"], ours["error"])
    return isinstance(theirs, str) and isinstance(ours, str) and ours.startswith(theirs)


def _events(text: str) -> list[Any]:
    """The JSON objects of a server-sent event stream (key order is not part of JSON)."""
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def http_answer(port: int, method: str, path: str, body: Any) -> tuple[int, Any]:
    if path.endswith("/index"):  # Triton unloads in the background: wait until it is done
        for _ in range(50):
            status, parsed = _http_once(port, method, path, body)
            if not any(m.get("state") in ("LOADING", "UNLOADING") for m in parsed):
                break
            time.sleep(0.2)
        return status, parsed
    return _http_once(port, method, path, body)


def _http_once(port: int, method: str, path: str, body: Any) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    connection.request(method, path, body=data)
    reply = connection.getresponse()
    raw = reply.read()
    connection.close()
    try:
        parsed: Any = json.loads(raw)
    except ValueError:
        parsed = _events(raw.decode(errors="replace"))
    if isinstance(parsed, list) and path.endswith("/index"):
        parsed = sorted(parsed, key=lambda m: m["name"])
    if isinstance(parsed, dict) and "outputs" in parsed:
        parsed["outputs"] = sorted(parsed["outputs"], key=lambda o: o["name"])
        parsed.pop("parameters", None)  # Triton adds sequence parameters to ensemble answers
    if isinstance(parsed, dict) and "ensemble_scheduling" in parsed:
        parsed["ensemble_scheduling"].pop("max_inflight_requests", None)  # newer than 2.51
    return reply.status, _blank(parsed)


def stream_answers(port: int, model: str, inputs: list[Any], **options: Any) -> list[Any]:
    """Each ModelStreamInfer answer as (outputs, triton_final_response) or the error text."""
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    got: list[Any] = []
    try:
        client.async_stream_infer(model, inputs, **options)
        while True:
            try:
                result, error = results.get(timeout=3)  # silence: the request is done
            except queue.Empty:
                break
            if error is not None:
                got.append(str(error))
                continue
            response = result.get_response()
            flag = response.parameters["triton_final_response"].bool_param
            got.append(([o.name for o in response.outputs], flag))
    finally:
        client.stop_stream()
    return got


def _count(n: int) -> list[Any]:
    tensor = grpcclient.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([n], np.int32))
    return [tensor]


GRPC_CALLS: list[tuple[str, Callable[[grpcclient.InferenceServerClient], Any]]] = [
    ("gRPC metadata", lambda c: c.get_model_metadata("add_sub", as_json=True)),
    ("gRPC statistics: missing version", lambda c: c.get_inference_statistics("add_sub", "7")),
    ("gRPC trace settings", lambda c: c.get_trace_settings(as_json=True)),
    ("gRPC unload: not loaded", lambda c: c.unload_model("never_heard_of")),
]


def grpc_answer(port: int, call: Callable[[grpcclient.InferenceServerClient], Any]) -> Any:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        return ("ok", _blank(call(client)))
    except InferenceServerException as error:
        return ("error", error.status(), error.message())
    finally:
        client.close()


def assemble_repository(folder: Path) -> Path:
    for source in (ROOT / "model_repository", ROOT / "benchmarks" / "models"):
        for model in source.iterdir():
            if (model / "config.pbtxt").exists() and not (folder / model.name).exists():
                shutil.copytree(
                    model, folder / model.name, ignore=shutil.ignore_patterns("__pycache__")
                )
    for name in TEST_MODELS:
        shutil.copytree(ROOT / "tests" / "integration" / "models" / name, folder / name)
    return folder


def main() -> int:
    explicit = ("--model-control-mode=explicit", "--load-model=*")
    differences = 0
    with tempfile.TemporaryDirectory(prefix="shoal-triton-diff-") as scratch:
        repo = assemble_repository(Path(scratch))
        compare.RESULTS.mkdir(parents=True, exist_ok=True)
        triton_log = compare.RESULTS / "triton_diff-triton.log"
        shoal_log = compare.RESULTS / "triton_diff-shoal.log"
        with triton_log.open("wb") as tlog, shoal_log.open("wb") as slog:
            triton = compare.start_triton(tlog, repo, explicit)
            try:
                shoal = compare.start_shoal(slog, repo, explicit)
                try:
                    differences = _run_all(triton, shoal)
                finally:
                    compare._stop(shoal)
            finally:
                compare._stop(triton)
    print(f"{differences} unexpected difference(s)")
    return 1 if differences else 0


def _run_all(triton: compare.Server, shoal: compare.Server) -> int:
    differences = 0

    def report(label: str, theirs: Any, ours: Any) -> None:
        nonlocal differences
        if _same(theirs, ours):
            print(f"OK    {label}")
            return
        known = label in KNOWN
        differences += not known
        print(f"{'KNOWN' if known else 'DIFF '} {label}")
        print(f"      triton {str(theirs)[:400]}")
        print(f"      shoal  {str(ours)[:400]}")

    for label, method, path, body in HTTP_CALLS:
        theirs = http_answer(triton.ports["http"], method, path, body)
        ours = http_answer(shoal.ports["http"], method, path, body)
        report(label, theirs, ours)
    for label, call in GRPC_CALLS:
        report(
            label, grpc_answer(triton.ports["grpc"], call), grpc_answer(shoal.ports["grpc"], call)
        )
    for flag in (False, True):
        label = f"ModelStreamInfer of a decoupled model, empty final response {flag}"
        theirs = stream_answers(
            triton.ports["grpc"], "token_streamer", _count(2), enable_empty_final_response=flag
        )
        ours = stream_answers(
            shoal.ports["grpc"], "token_streamer", _count(2), enable_empty_final_response=flag
        )
        report(label, theirs, ours)
    return differences


if __name__ == "__main__":
    sys.exit(main())
