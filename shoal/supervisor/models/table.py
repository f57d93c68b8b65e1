"""The model table the server logs once its models are loaded, as tritonserver does."""

from __future__ import annotations

from collections.abc import Sequence

from shoal.core.types import RepositoryEntry

_HEADER = ("Model", "Version", "Status")
_MAX_STATUS = 100  # a long reason is cut here: the full one was logged when the load failed


def _status(entry: RepositoryEntry) -> str:
    state = entry.state or "UNAVAILABLE"
    reason = entry.reason.removeprefix(f"failed to load '{entry.name}' version {entry.version}: ")
    text = f"{state}: {reason}" if reason and state != "READY" else state
    text = " ".join(text.split())  # one line per model, whatever the reason holds
    return text if len(text) <= _MAX_STATUS else text[: _MAX_STATUS - 3] + "..."


def format_model_table(entries: Sequence[RepositoryEntry]) -> str:
    """``+-------+---------+--------+`` framed rows of model, version and status. Models never
    asked to load (explicit mode) are left out, as tritonserver does."""
    shown = [e for e in entries if e.state or e.reason]
    rows = [_HEADER] + [(e.name, e.version or "-", _status(e)) for e in shown]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(row: tuple[str, str, str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    # No models: the header and the closing rule only, as Triton's TablePrinter writes it.
    return "\n".join([rule, line(rows[0]), rule, *map(line, rows[1:]), rule])
