"""The request hot path, compiled to C with mypyc at install time, and the guard around it.

`setup.py` compiles the modules named in :data:`HOT_PATH` when mypyc and a C compiler are
there; everything else stays interpreted, and so does the hot path where it cannot be built
(another Python, no compiler, ``SHOAL_PURE_PYTHON=1``). A compiled module is an extension file
beside its source, and Python imports the extension first: after an edit or a checkout it
would run stale code. The build records a hash of each source it compiled
(:func:`record_sources`); :func:`prefer_fresh_sources` compares them with the sources there now
and, on any difference, imports the whole hot path from source, all of it or none, since the
compiled modules call each other's classes directly. (Hashes, not modification times: a wheel
installs its files in any order, with fresh times.)

This module stays interpreted; it runs on every ``import shoal``, in stubs too.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from types import ModuleType

HOT_PATH: tuple[str, ...] = (
    "shoal/ipc/_alloc.py",
    "shoal/ipc/_bell.py",
    "shoal/ipc/busy_poll.py",
    "shoal/ipc/down_set.py",
    "shoal/ipc/_ring.py",
    "shoal/ipc/arena.py",
    "shoal/ipc/dtypes.py",
    "shoal/ipc/call_messages.py",
    "shoal/ipc/memory_messages.py",
    "shoal/ipc/messages.py",
    "shoal/ipc/plain_execute.py",
    "shoal/ipc/model_messages.py",
    "shoal/ipc/records.py",
    "shoal/ipc/queue.py",
    "shoal/ipc/tensor.py",
    "shoal/ipc/whole_results.py",
    "shoal/ipc/stat_counters.py",
    "shoal/frontends/_binary.py",
    "shoal/frontends/_last_step.py",
    "shoal/frontends/workers/_wire.py",
    "shoal/frontends/workers/_response_wire.py",
    "shoal/frontends/workers/host.py",
    "shoal/frontends/workers/arenas.py",
    "shoal/frontends/workers/outputs.py",
    "shoal/frontends/workers/answer_frames.py",
    "shoal/frontends/http/_body_reader.py",
    "shoal/frontends/http/_coalescing.py",
    "shoal/frontends/http/_compression.py",
    "shoal/frontends/http/_fast_request.py",
    "shoal/frontends/http/_fast_conn.py",
    "shoal/frontends/http/fast_path.py",
    "shoal/frontends/_output_bytes.py",
    "shoal/frontends/_params.py",
    "shoal/frontends/http/_plain_request.py",
    "shoal/frontends/http/_request.py",
    "shoal/frontends/http/_response.py",
    "shoal/frontends/http/app.py",
    "shoal/frontends/http/routing.py",
    "shoal/supervisor/drain.py",
    "shoal/supervisor/instances/answers.py",
    "shoal/supervisor/instances/dispatch.py",
    "shoal/supervisor/instances/feeder.py",
    "shoal/supervisor/instances/handoff.py",
    "shoal/supervisor/instances/handshake.py",
    "shoal/supervisor/instances/instance.py",
    "shoal/supervisor/instances/ledger.py",
    "shoal/supervisor/instances/lifecycle.py",
    "shoal/supervisor/instances/outbox.py",
    "shoal/supervisor/instances/outputs.py",
    "shoal/supervisor/instances/spec.py",
    "shoal/supervisor/schedulers/_batching.py",
    "shoal/supervisor/schedulers/_queues.py",
    "shoal/supervisor/schedulers/base.py",
    "shoal/supervisor/schedulers/default.py",
    "shoal/supervisor/schedulers/dynamic.py",
    "shoal/supervisor/memory/segments.py",
    "shoal/supervisor/service.py",
    "shoal/supervisor/requests/client_shm.py",
    "shoal/supervisor/requests/staging.py",
    "shoal/supervisor/requests/summary.py",
    "shoal/supervisor/requests/responses.py",
    "shoal/supervisor/requests/relayed.py",
    "shoal/supervisor/promise.py",
    "shoal/supervisor/extensions/statistics.py",
    "shoal/supervisor/extensions/trace_settings.py",
    "shoal/supervisor/models/loaded.py",
    "shoal/supervisor/models/version.py",
    "shoal/supervisor/instances/decoupled.py",
    "shoal/supervisor/instances/process.py",
    "shoal/core/types.py",
    "shoal/core/packed.py",
    "shoal/supervisor/requests/packed.py",
    "shoal/supervisor/requests/checked.py",
    "shoal/supervisor/work.py",
    "shoal/frontends/h2/errors.py",
    "shoal/frontends/h2/frames.py",
    "shoal/frontends/h2/floods.py",
    "shoal/frontends/h2/header_blocks.py",
    "shoal/frontends/h2/streams.py",
    "shoal/frontends/h2/answers.py",
    "shoal/frontends/h2/sending.py",
    "shoal/frontends/h2/reading.py",
    "shoal/frontends/h2/placing.py",
    "shoal/frontends/h2/scatter.py",
    "shoal/frontends/h2/connection.py",
    "shoal/frontends/grpc/_wire.py",
    "shoal/frontends/grpc/_params.py",
    "shoal/frontends/grpc/_tensors.py",
    "shoal/frontends/grpc/_plain_request.py",
    "shoal/frontends/grpc/_reply.py",
    "shoal/frontends/grpc/_infer.py",
    "shoal/frontends/grpc/native_headers.py",
    "shoal/frontends/grpc/native_messages.py",
    "shoal/frontends/grpc/native_split.py",
    "shoal/frontends/grpc/infer_call.py",
    "shoal/frontends/grpc/native_context.py",
    "shoal/frontends/grpc/native_call.py",
    "shoal/frontends/grpc/native.py",
    "shoal/frontends/workers/client.py",
    "shoal/frontends/workers/head_bytes.py",
    "shoal/frontends/workers/packing.py",
    "shoal/frontends/workers/snapshots.py",
    "shoal/frontends/workers/direct_stubs.py",
    "shoal/frontends/workers/direct_records.py",
    "shoal/frontends/workers/direct.py",
    "shoal/stub/direct_rings.py",
    "shoal/stub/executor.py",
    "shoal/stub/execute_checks.py",
    "shoal/stub/memory.py",
    "shoal/stub/inline_inputs.py",
    "shoal/stub/model_loop.py",
    "shoal/stub/open_requests.py",
    "shoal/stub/pump.py",
    "shoal/stub/response_records.py",
    "shoal/stub/serve_loop.py",
    "shoal/stub/tensors_out.py",
)

#: Written beside this module by the build: the hash of each source it compiled.
RECORD = "_hot_build.json"

#: "compiled", "interpreted" (nothing built, or SHOAL_PURE_PYTHON) or "stale" (built from other
#: sources than those there now: the hot path then runs interpreted).
state = "interpreted"


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _extension(source: str) -> str | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = source.removesuffix(".py") + suffix
        if os.path.exists(candidate):
            return candidate
    return None


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def record_sources(root: str, paths: Sequence[str]) -> None:
    """Called by the build before it compiles ``paths`` (relative to ``root``)."""
    record = {path: _digest(os.path.join(root, path)) for path in paths}
    with open(os.path.join(root, "shoal", RECORD), "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)


def _built_state(root: str, paths: Sequence[str]) -> str:
    built = [p for p in paths if _extension(os.path.join(root, p)) is not None]
    if not built:
        return "interpreted"
    if len(built) != len(paths):
        return "stale"
    try:
        with open(os.path.join(root, "shoal", RECORD)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return "stale"
    for path in paths:
        if record.get(path) != _digest(os.path.join(root, path)):
            return "stale"
    return "compiled"


class _SourceFirst:
    """A meta path finder that loads the named modules from their ``.py`` files."""

    def __init__(self, sources: dict[str, str]) -> None:
        self._sources = sources

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        source = self._sources.get(name)
        if source is None:
            return None
        return importlib.util.spec_from_file_location(name, source)


def prefer_fresh_sources(package_dir: str) -> str:
    """Decide how the hot path is imported in this process; returns the :data:`state`."""
    global state
    root = os.path.dirname(package_dir)
    state = _built_state(root, HOT_PATH)
    if os.environ.get("SHOAL_PURE_PYTHON"):
        state = "interpreted"  # asked for: no warning about a stale build
    elif state != "stale":
        return state
    sources = {_module_name(p): os.path.join(root, p) for p in HOT_PATH}
    sys.meta_path.insert(0, _SourceFirst(sources))
    return state
