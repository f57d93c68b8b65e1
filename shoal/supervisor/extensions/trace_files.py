"""Triton's trace files (``--trace-config triton,file=PATH``): what a sampled request's trace
holds, when it is written, and where (Triton's ``src/tracer.cc``).

Each trace setting in effect (the global one, and each model's own) is a :class:`TraceLog`: it
samples requests (``trace_rate``, ``trace_count``, the count reported as it runs down) and
buffers the traces of the requests it sampled. The buffer goes to ``PATH.<n>`` (``n`` counting
up from 0 per file) every ``log_frequency`` traces, and when ``trace_count`` runs out and its
last trace is in; what is left goes to ``PATH.<n>`` (``log_frequency`` set) or to ``PATH``
itself when the setting is replaced (an update) or the server stops. ``PATH`` is one JSON list
that each write extends: Triton closes it only at exit, shoal keeps it a valid document after
every write (and writes it as it goes when nothing else would: no trace_count, no
log_frequency), so it can be read while the server runs and survives a crash.

Only the core writes (with two frontend workers too): one process, one valid file. A request
the HTTP frontend serves in the core's process (one frontend worker) also gets the frontend's
timestamps (``HTTP_RECV_START``... as Triton's ``http_server.cc`` takes them), in an entry of
their own with the trace's id, as Triton writes them: its trace is held (:attr:`Trace.held`)
until the frontend hands them over, after it sent the response (:meth:`Trace.frontend`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("shoal")

#: Traces a log with no trace_count and no log_frequency holds before it appends them to its
#: file (Triton holds them all until exit), and the bytes (TENSORS traces of large tensors).
APPEND_EVERY = 64
APPEND_BYTES = 16 << 20


class TraceFile:
    """One trace file path, shared by every setting that names it."""

    def __init__(self, path: str) -> None:
        self.path = path
        #: The next ``PATH.<n>``.
        self._index = 0
        #: Whether ``PATH`` was written by this server (the first write replaces the file).
        self._started = False
        self._failed = False

    def save(self, traces: list[str], indexed: bool) -> None:
        """Write ``traces`` (each the comma-separated JSON objects of one request) to the next
        ``PATH.<n>`` (``indexed``) or at the end of ``PATH``'s list."""
        body = ",".join(traces).encode()
        try:
            if indexed:
                name = f"{self.path}.{self._index}"
                self._index += 1
                with open(name, "wb") as f:
                    f.write(b"[" + body + b"]")
            elif not self._started:
                with open(self.path, "wb") as f:
                    f.write(b"[" + body + b"]")
                self._started = True
            else:
                self._append(body)
        except OSError as error:
            if not self._failed:  # once: a full disk must not flood the log
                log.error(
                    "cannot write the trace file %r (--trace-config triton,file=): %s; "
                    "traces are dropped",
                    self.path,
                    error,
                )
            self._failed = True

    def _append(self, body: bytes) -> None:
        """``body`` at the end of ``PATH``'s list; a file rotated away (moved, or truncated
        as logrotate's copytruncate does) starts a new list rather than losing the traces."""
        with open(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644), "r+b") as f:
            end = f.seek(0, 2)
            if end == 0:
                f.write(b"[" + body + b"]")
            else:
                f.seek(end - 1)  # over the closing bracket
                f.write(b"," + body + b"]")


class TraceLog:
    """A trace setting in effect: its sampling and the traces it buffered (Triton's
    ``TraceSetting``). A new one replaces it at each update (:meth:`retire`)."""

    def __init__(
        self, level: list[str], rate: int, count: int, log_frequency: int, file: TraceFile | None
    ) -> None:
        """``file`` None: no trace is written (trace_mode opentelemetry, or no file)."""
        self.level = level
        self.timestamps = "TIMESTAMPS" in level
        self.tensors = "TENSORS" in level
        self.rate = rate
        #: Traces still to take (-1: no limit); reported as trace_count.
        self.count = count
        self.log_frequency = log_frequency
        self.file = file
        self._requests = 0
        self._created = 0
        self._collected = 0
        self._buffer: list[str] = []
        self._buffered = 0  # characters in _buffer
        self._retired = False

    def sample(self) -> bool:
        """Whether the next request is traced: every ``rate``-th, ``count`` of them at most."""
        if self.level == ["OFF"] or self.count == 0:
            return False
        self._requests += 1
        if self._requests % self.rate:
            return False
        if self.count > 0:
            self.count -= 1
        self._created += 1
        return True

    def collect(self, trace: str) -> None:
        """A sampled request's trace is complete."""
        self._buffer.append(trace)
        self._buffered += len(trace)
        self._collected += 1
        all_in = self._collected == self._created
        if (self.count == 0 and all_in) or (
            self.log_frequency and len(self._buffer) >= self.log_frequency
        ):
            self._save(indexed=True)
        elif self._retired and all_in:
            self._save(indexed=self.log_frequency != 0)
        elif self._appending and (
            len(self._buffer) >= APPEND_EVERY or self._buffered >= APPEND_BYTES
        ):
            self._save(indexed=False)

    @property
    def _appending(self) -> bool:
        """Whether its traces are appended to PATH as they come (no count, no frequency)."""
        return self.count < 0 and not self.log_frequency

    def late(self, entries: str) -> None:
        """Entries of a trace already collected (a child that ended after its parent): with
        the next write, or at once when no other write would come (the log was replaced, its
        count is spent)."""
        self._buffer.append(entries)
        self._buffered += len(entries)
        if self._retired or (self.count == 0 and self._collected == self._created):
            self._save(indexed=self.log_frequency != 0 or self.count == 0)

    def dropped(self) -> None:
        """A sampled request whose trace will never come (it failed before it started)."""
        self._created -= 1
        if self._retired and self._collected == self._created:
            self._save(indexed=self.log_frequency != 0)

    def retire(self) -> None:
        """Replaced (or the server stops): what it holds is written once its traces are in."""
        self._retired = True
        if self._collected == self._created:
            self._save(indexed=self.log_frequency != 0)

    def close(self) -> None:
        """The server stops: what it holds is written now (a trace still open, of a request
        the shutdown cut short, is written if it ends after all)."""
        self._retired = True
        self._save(indexed=self.log_frequency != 0)

    def _save(self, indexed: bool) -> None:
        traces, self._buffer = self._buffer, []
        self._buffered = 0
        if traces and self.file is not None:
            self.file.save(traces, indexed)


#: Trace ids, as Triton's: one sequence for the server, from 1.
_next_id = [0]


class Trace:
    """One sampled request's entries: its model entry, then a timestamp entry per activity."""

    def __init__(
        self,
        trace_log: TraceLog,
        model: str,
        version: int,
        request_id: str,
        parent_id: int = 0,
        trace_id: int = 0,
    ) -> None:
        """``trace_id``: one :func:`next_id` gave already (0: a new one)."""
        self.id = trace_id or next_id()
        self._log = trace_log
        entry: dict[str, Any] = {"id": self.id, "model_name": model, "model_version": version}
        if request_id:
            entry["request_id"] = request_id
        if parent_id:
            entry["parent_id"] = parent_id
        self._entries = [json.dumps(entry, separators=(",", ":"))]
        self._open = True
        self._parent: Trace | None = None
        #: Called once it is finished (its settings forget it).
        self.on_finish: Callable[[], object] | None = None
        #: Whether its frontend's timestamps are due (:meth:`frontend`): it is written then.
        self.held = False

    @property
    def trace_log(self) -> TraceLog:
        return self._log

    def stamp(self, name: str, ns: int | None = None) -> None:
        """Record activity ``name`` at ``ns`` (monotonic ns, as Triton's steady clock; now)."""
        if self._log.timestamps and self._open:
            at = time.monotonic_ns() if ns is None else ns
            self._entries.append(f'{{"id":{self.id},"timestamps":[{{"name":"{name}","ns":{at}}}]}}')

    @property
    def tensors(self) -> bool:
        """Whether its tensors are traced (level TENSORS)."""
        return self._log.tensors and self._open

    def tensor(self, activity: str, name: str, datatype: str, shape: str, data: str) -> None:
        """Record a tensor at ``activity`` (TENSOR_QUEUE_INPUT, TENSOR_BACKEND_OUTPUT):
        ``data`` its values as Triton writes them (comma-separated), ``shape`` its dims so."""
        if self.tensors:
            tensor = {"name": name, "data": data, "shape": shape, "dtype": datatype}
            entry = {"id": self.id, "activity": activity, "tensor": tensor}
            self._entries.append(json.dumps(entry, separators=(",", ":")))

    def child(self, model: str, version: int, request_id: str) -> Trace:
        """The trace of a request this one makes (an ensemble's step), written with it: one
        trace for trace_count and log_frequency, as in Triton."""
        child = Trace(self._log, model, version, request_id, self.id)
        child._parent = self
        return child

    def finish(self) -> None:
        """The request is over: its trace goes to its parent's, or to its log (once)."""
        if not self._open:
            return
        self._open = False
        if self.on_finish is not None:
            self.on_finish()
        parent = self._parent
        if parent is None:
            if not self.held:
                self._log.collect(",".join(self._entries))
        elif parent._open:
            parent._entries += self._entries
        else:  # a child that outlived its parent: written, not counted as a trace
            self._log.late(",".join(self._entries))

    def frontend(self, timestamps: list[tuple[str, int]]) -> None:
        """The frontend's timestamps (name, monotonic ns) of a :attr:`held` trace: one entry
        of their own, as Triton's frontends write them; the trace is written once it is
        finished too (empty: the frontend has none, it is written without)."""
        if not self.held:
            return
        self.held = False
        if timestamps and self._log.timestamps:
            stamps = ",".join(f'{{"name":"{name}","ns":{ns}}}' for name, ns in timestamps)
            self._entries.append(f'{{"id":{self.id},"timestamps":[{stamps}]}}')
        if not self._open:
            self._log.collect(",".join(self._entries))


def next_id() -> int:
    """The next trace id (the server's one sequence)."""
    _next_id[0] += 1
    return _next_id[0]


__all__ = ["Trace", "TraceFile", "TraceLog", "next_id"]
