"""Triton's trace extension: global and per-model trace settings, read and changed at run time.

Settings are stored, validated and reported as Triton does; shoal writes no trace file (see
docs/http.md, "Trace settings"). Values have Triton's string forms: ``trace_level`` is a list
(``["OFF"]`` or some of ``["TIMESTAMPS", "TENSORS"]``), every other setting one string.

A model's settings start as a copy of the global ones the first time they are updated; a setting
cleared with ``None`` (JSON ``null``, an empty gRPC value) follows the global one again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from shoal.core.errors import InvalidArgument, Unsupported
from shoal.core.types import TraceChange, TraceValue

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


class TraceSettings:
    """The global settings and each model's own settings."""

    def __init__(self, known_model: Callable[[str], bool] = lambda _: True) -> None:
        self._global: dict[str, TraceValue] = dict(DEFAULTS)
        self._models: dict[str, dict[str, TraceValue]] = {}
        self._known_model = known_model

    def current(self, model: str = "") -> dict[str, TraceValue]:
        """The settings in effect for ``model`` ("" for the global ones)."""
        self._check_model(model)
        return {**self._global, **self._models.get(model, {})}

    def update(self, changes: Mapping[str, TraceChange], model: str = "") -> dict[str, TraceValue]:
        """Apply ``changes`` (all or nothing) and return the settings now in effect."""
        self._check_model(model)
        checked = {key: self._value(key, value, model) for key, value in changes.items()}
        now = self.current(model)
        level = checked.get("trace_level") or now["trace_level"]
        if level != ["OFF"] and not now["trace_file"]:
            # Triton's check and words: a level other than OFF needs a file to write to, and
            # shoal has none (it writes no traces).
            raise InvalidArgument(
                "Attempting to set invalid trace setting :trace file name is not given "
                "(shoal writes no traces: trace_level can only be OFF)"
            )
        target = self._global if not model else self._models.setdefault(model, {})
        for key, value in checked.items():
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
        if model and not target:
            del self._models[model]
        return self.current(model)

    def _check_model(self, model: str) -> None:
        if model and not self._known_model(model):
            raise InvalidArgument(f"Request for unknown model: '{model}' is not found")

    def _value(self, key: str, value: TraceChange, model: str) -> TraceValue | None:
        if key not in DEFAULTS:
            raise InvalidArgument(
                f"unknown trace setting '{key}'; expected one of {', '.join(DEFAULTS)}"
            )
        if value is None:
            if not model:
                raise InvalidArgument(
                    f"trace setting '{key}' can only be cleared for a model: give a value"
                )
            return None
        if key in _FIXED:
            if value != self.current(model)[key]:
                raise Unsupported(_FIXED[key])
            return str(value)
        if key == "trace_level":
            return _level(value)
        return _integer(key, value)


def _level(value: TraceChange) -> list[str]:
    if isinstance(value, str):
        levels = [value]
    elif isinstance(value, int) or value is None or not value:
        levels = []
    else:
        levels = list(value)
    if not levels or not all(isinstance(v, str) for v in levels):
        raise InvalidArgument(
            "trace setting 'trace_level' must be a list of strings, e.g. [\"TIMESTAMPS\"]"
        )
    unknown = [v for v in levels if v not in ("OFF", *LEVELS)]
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


__all__ = ["DEFAULTS", "TraceChange", "TraceSettings", "TraceValue"]
