"""Triton's trace extension: global and per-model trace settings, read and changed at run time.

Settings are stored, validated and reported as Triton does; ``--trace-config`` sets the global
ones at start. A request sampled for tracing carries a trace context to its model
(:meth:`TraceSettings.context_for`) and, in trace_mode triton, its trace goes to the trace file
(:mod:`.trace_files`; ``trace_count`` is reported as it runs down, as in Triton).
Values have Triton's string forms: ``trace_level`` is a list
(``["OFF"]`` or some of ``["TIMESTAMPS", "TENSORS"]``), every other setting one string.

A model's settings start as a copy of the global ones the first time they are updated; a setting
cleared with ``None`` (JSON ``null``, an empty gRPC value) follows the global one again, and a
cleared global setting goes back to its value at start (``--trace-config``), as in Triton.
"""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from shoal.core.errors import InvalidArgument, Unsupported
from shoal.core.types import TraceChange, TraceValue
from shoal.supervisor.extensions.otel_settings import check_batch_span_settings
from shoal.supervisor.extensions.trace_files import Trace, TraceFile, TraceLog, next_id

LEVELS = ("TIMESTAMPS", "TENSORS")
DEFAULTS: Mapping[str, TraceValue] = {
    "trace_file": "",
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_mode": "triton",
}
#: The lowest value of each integer setting (trace_count -1: no limit).
_MINIMUM = {"trace_rate": 1, "trace_count": -1, "log_frequency": 0}
#: Fixed when the server starts, as in Triton.
_FIXED = {
    "trace_file": "trace file location can not be updated through network protocol",
    "trace_mode": "trace mode can not be updated through network protocol",
}


#: ``trace_level`` when tracing is off (a list made once, not per request).
_OFF: Final[list[str]] = ["OFF"]


class TraceSettings:
    """The global settings and each model's own settings."""

    def __init__(
        self,
        known_model: Callable[[str], bool] = lambda _: True,
        initial: Mapping[str, TraceValue] | None = None,
    ) -> None:
        """``initial``: the global settings ``--trace-config`` gave (checked by the CLI)."""
        self._global: dict[str, TraceValue] = {**DEFAULTS, **(initial or {})}
        #: What a cleared global setting goes back to (Triton's ``global_default_``).
        self._startup: Mapping[str, TraceValue] = dict(self._global)
        self._models: dict[str, dict[str, TraceValue]] = {}
        self._known_model = known_model
        #: Trace files by path (a file named by several settings is one, its index shared).
        self._files: dict[str, TraceFile] = {}
        #: The settings in effect, sampling and buffering: the global one, each model's own.
        self._log = self._new_log("")
        self._logs: dict[str, TraceLog] = {}
        #: Requests sampled whose trace has not begun (:meth:`begin`), by their context.
        self._pending: dict[str, TraceLog] = {}
        #: The traces begun and not finished, by their context (a BLS call names its caller's).
        self._running: dict[str, Trace] = {}
        #: Sampled requests whose frontend will hand its timestamps (:meth:`hold`): the id
        #: given, by context, until their trace begins; then their traces, by id, until then.
        self._held_ids: dict[str, int] = {}
        self._held: dict[int, Trace] = {}
        #: Called after every change (direct dispatch takes its routes back: a model traced now
        #: must take the core's way).
        self.on_change: list[Callable[[], None]] = []

    def traced(self, model: str) -> bool:
        """Whether tracing is on for ``model`` (some of its requests get a context)."""
        own = self._models.get(model)
        level = own["trace_level"] if own and "trace_level" in own else self._global["trace_level"]
        return level != _OFF

    def context_for(self, model: str) -> str:
        """The trace context of the next request to ``model``: "" unless tracing is on for it
        and this request is the ``trace_rate``-th since the last (``trace_count`` traces at
        most), as Triton samples. The caller then calls :meth:`begin` with it.

        The context is what ``request.trace().get_context()`` returns in the model: a W3C
        ``traceparent`` as JSON, the form Triton gives in OpenTelemetry mode, which a model
        can hand to OpenTelemetry's propagator.
        """
        own = self._models.get(model)
        level = own["trace_level"] if own and "trace_level" in own else self._global["trace_level"]
        if level == _OFF:  # every request asks: no look-up of its log for it
            return ""
        trace_log = self._logs.get(model, self._log)
        if not trace_log.sample():
            return ""
        parent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
        context = json.dumps({"traceparent": parent})
        if trace_log.file is not None:
            self._pending[context] = trace_log
        return context

    def begin(self, context: str, model: str, version: int, request_id: str) -> Trace | None:
        """The trace of a request :meth:`context_for` sampled (None: none is written)."""
        trace_log = self._pending.pop(context, None)
        if trace_log is None:
            return None
        trace_id = self._held_ids.pop(context, 0) if self._held_ids else 0
        trace = Trace(trace_log, model, version, request_id, 0, trace_id)
        self._running[context] = trace
        trace.on_finish = functools.partial(self._running.pop, context, None)
        if trace_id:
            trace.held = True
            self._held[trace_id] = trace
        return trace

    def hold(self, context: str) -> int:
        """The id of the trace a sampled request's will be, whose frontend hands its own
        timestamps after the response (:meth:`frontend`): the trace is written then. 0: no
        trace is written for it."""
        if context not in self._pending:
            return 0
        trace_id = self._held_ids[context] = next_id()
        return trace_id

    def frontend(self, trace_id: int, timestamps: list[tuple[str, int]]) -> None:
        """The frontend's timestamps of the request :meth:`hold` gave ``trace_id``; its trace
        is written once the request is over (empty: the frontend has none)."""
        trace = self._held.pop(trace_id, None)
        if trace is not None:
            trace.frontend(timestamps)
        elif self._held_ids:  # its trace never began (refused before it was queued)
            for context, held in list(self._held_ids.items()):
                if held == trace_id:
                    del self._held_ids[context]

    def running(self, context: str) -> Trace | None:
        """The unfinished trace of the request with trace context ``context``."""
        return self._running.get(context)

    def close(self) -> None:
        """The server stops: every setting writes what it holds."""
        for trace in list(self._held.values()):  # the frontend's timestamps will not come
            trace.frontend([])
        self._held.clear()
        for trace_log in [self._log, *self._logs.values(), *self._pending.values()]:
            trace_log.close()
        self._pending.clear()

    def current(self, model: str = "") -> dict[str, TraceValue]:
        """The settings in effect for ``model`` ("" for the global ones); ``trace_count`` is
        what is left of it."""
        self._check_model(model)
        count = str(self._logs.get(model, self._log).count)
        return {**self._global, **self._models.get(model, {}), "trace_count": count}

    def update(self, changes: Mapping[str, TraceChange], model: str = "") -> dict[str, TraceValue]:
        """Apply ``changes`` (all or nothing) and return the settings now in effect."""
        self._check_model(model)
        checked = {key: self._value(key, value, model) for key, value in changes.items()}
        now = self.current(model)
        level = checked.get("trace_level") or now["trace_level"]
        if level != ["OFF"] and now["trace_mode"] == "triton" and not now["trace_file"]:
            # Triton's check and words: in triton mode a level other than OFF needs a file
            # (given at start: --trace-config triton,file=PATH).
            raise InvalidArgument(
                "Attempting to set invalid trace setting :trace file name is not given "
                "(start the server with --trace-config triton,file=PATH, or "
                "--trace-config mode=opentelemetry)"
            )
        target = self._global if not model else self._models.setdefault(model, {})
        _store(target, checked)
        if model and not target:
            del self._models[model]
        self._renew(model, "trace_count" in checked)
        for each in self.on_change:
            each()
        return self.current(model)

    def _renew(self, model: str, counted: bool) -> None:
        """New logs for the settings an update changed (Triton replaces them: their sampling
        starts again, and the replaced ones write what they hold): ``model``'s, or for a
        global update the global one and every model's own (they follow the global one in
        what they do not set). ``counted``: the update set trace_count; else what is left of
        each replaced count goes on."""
        if not model:
            replaced = self._log
            count = None if counted else replaced.count
            replaced.retire()
            self._log = self._new_log("", count)
        for name in [model] if model else list(self._logs):
            old = self._logs.pop(name, None)
            if old is not None:
                old.retire()
            if name in self._models:
                own_count = "trace_count" in self._models[name] and not (counted and model)
                count = old.count if old is not None and own_count else None
                self._logs[name] = self._new_log(name, count)

    def _new_log(self, model: str, count: int | None = None) -> TraceLog:
        """The log of the settings in effect for ``model``; ``count``: what is left of its
        trace_count (None: the setting's value, or the global log's for a model that sets
        none)."""
        own = self._models.get(model, {}) if model else {}
        settings = {**self._global, **own}
        if count is None:
            count = int(str(settings["trace_count"]))
            if model and "trace_count" not in own:
                count = self._log.count
        path = str(settings["trace_file"])
        file = None
        if path and settings["trace_mode"] == "triton":
            file = self._files.get(path)
            if file is None:
                file = self._files[path] = TraceFile(path)
        level = settings["trace_level"]
        return TraceLog(
            [level] if isinstance(level, str) else list(level),
            int(str(settings["trace_rate"])),
            count,
            int(str(settings["log_frequency"])),
            file,
        )

    def _check_model(self, model: str) -> None:
        if model and not self._known_model(model):
            # Triton's words for the trace extension (http_server.cc, grpc_server.cc)
            raise InvalidArgument(f"Request for unknown model : {model}")

    def _value(self, key: str, value: TraceChange, model: str) -> TraceValue | None:
        if key not in DEFAULTS:
            raise InvalidArgument(
                f"unknown trace setting '{key}'; expected one of {', '.join(DEFAULTS)}"
            )
        if value is None:
            return None if model else self._startup[key]
        if key in _FIXED:
            if value != self.current(model)[key]:
                raise Unsupported(_FIXED[key])
            return str(value)
        if key == "trace_level":
            return _level(value)
        return _integer(key, value)


def _store(target: dict[str, TraceValue], checked: Mapping[str, TraceValue | None]) -> None:
    """Set the checked values; None clears a model's own setting."""
    for key, value in checked.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value


def _listed(value: TraceChange) -> list[Any]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, int) or value is None or not value:
        return []
    return list(value)


def _level(value: TraceChange) -> list[str]:
    levels = _listed(value)
    if not levels or not all(isinstance(v, str) for v in levels):
        raise InvalidArgument(
            "trace setting 'trace_level' must be a list of strings, e.g. [\"TIMESTAMPS\"]"
        )
    unknown = [v for v in levels if v != "OFF" and v not in LEVELS]
    if unknown:
        raise InvalidArgument(
            f"trace setting 'trace_level' has unknown level {unknown[0]!r}; expected OFF, "
            "TIMESTAMPS or TENSORS"
        )
    chosen = [level for level in LEVELS if level in levels]
    return chosen or ["OFF"]


def _integer(key: str, value: TraceChange) -> str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidArgument(f"trace setting '{key}' must be an integer given as a string")
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgument(  # Triton's words first
            f"Unable to parse '{key}', got: {value}: trace setting '{key}' must be an integer "
            "given as a string"
        ) from None
    if number < _MINIMUM[key]:
        raise InvalidArgument(
            f"trace setting '{key}' must be at least {_MINIMUM[key]}, got {number}"
        )
    return str(number)


#: ``--trace-config`` keys (Triton's) and the setting each one sets.
_CONFIG_KEYS = {
    "file": "trace_file",
    "level": "trace_level",
    "rate": "trace_rate",
    "count": "trace_count",
    "log-frequency": "log_frequency",
    "mode": "trace_mode",
}


def parse_trace_config(entries: Sequence[str]) -> dict[str, TraceValue]:
    """The global settings of Triton's ``--trace-config [<mode>,]<key>=<value>`` flags (``level``
    may repeat); ValueError names a malformed one. OpenTelemetry's exporter settings
    (``opentelemetry,url=...``, ``resource=...``) are accepted and unused: shoal exports none;
    in OpenTelemetry mode its batch span settings are checked as tritonserver checks them."""
    settings: dict[str, TraceValue] = {}
    levels: list[str] = []
    exporter: dict[str, str] = {}
    for entry in entries:
        parsed = _config_entry(entry)
        if parsed is None:
            key, _, value = entry.rpartition(",")[2].partition("=")
            exporter[key] = value
            continue
        name, value = parsed
        try:
            if name == "trace_level":
                levels.append(value.upper())
            else:
                settings[name] = _config_value(name, value)
        except InvalidArgument as error:
            raise ValueError(f"--trace-config {entry}: {error.message}") from None
    if levels:
        settings["trace_level"] = _flag_level(levels)
    if settings.get("trace_mode") == "opentelemetry":
        check_batch_span_settings(exporter)
    return settings


def _flag_level(levels: list[str]) -> list[str]:
    try:
        chosen = _level(levels)
    except InvalidArgument as error:
        raise ValueError(f"--trace-config: {error.message}") from None
    # tritonserver: an OFF among the start flags turns tracing off whatever else they say.
    return ["OFF"] if "OFF" in levels else chosen


def _config_entry(entry: str) -> tuple[str, str] | None:
    """The setting's name and value (None for an OpenTelemetry exporter setting)."""
    scope, _, setting = entry.rpartition(",")
    key, eq, value = setting.partition("=")
    if not eq or scope not in ("", "triton", "opentelemetry"):
        raise ValueError(f"--trace-config expects [<mode>,]<setting>=<value>, got '{entry}'")
    if scope == "opentelemetry":
        return None
    return _config_name(key), value


def _config_name(key: str) -> str:
    name = _CONFIG_KEYS.get(key)
    if name is None:
        known = ", ".join(_CONFIG_KEYS)
        raise ValueError(f"--trace-config: unknown setting '{key}'; expected one of {known}")
    return name


def _config_value(name: str, value: str) -> TraceValue:
    if name == "trace_mode":
        if value not in ("triton", "opentelemetry"):
            raise InvalidArgument(f"mode must be triton or opentelemetry, not '{value}'")
        return value
    if name == "trace_file":
        return value
    return _integer(name, value)


__all__ = ["DEFAULTS", "TraceChange", "TraceSettings", "TraceValue", "parse_trace_config"]
