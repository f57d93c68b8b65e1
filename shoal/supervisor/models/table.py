"""The model table the server logs once its models are loaded, as tritonserver does.

Laid out as Triton's ``TablePrinter`` lays it out when its output is not a terminal: 500
columns in all, each column as wide as its longest cell or its fair share of the room, a cell
longer than its share carried on over the next lines of its row (never cut, so that the whole
of a load error can be found in the log, as Triton's QA greps for it).
"""

from __future__ import annotations

from collections.abc import Sequence

from shoal.core.types import RepositoryEntry

_HEADER = ("Model", "Version", "Status")
#: tritonserver's table width when its standard output is not a terminal.
_TABLE_WIDTH = 500


def _status(entry: RepositoryEntry) -> str:
    state = entry.state or "UNAVAILABLE"
    reason = entry.reason.removeprefix(f"failed to load '{entry.name}' version {entry.version}: ")
    text = f"{state}: {reason}" if reason and state != "READY" else state
    return " ".join(text.split())  # one paragraph per model, whatever the reason holds


def _shares(widths: list[int]) -> list[int]:
    """Each column's width: an equal share of the room, handed on (Triton's ``FairShare``)
    from the narrowest columns that need less to the wider ones after them."""
    count = len(widths)
    shares = [float((_TABLE_WIDTH - 3 * count - 1) // count)] * count
    order = sorted(range(count), key=lambda i: widths[i])
    for rank, column in enumerate(order):
        if widths[column] < shares[column]:
            excess = shares[column] - widths[column]
            shares[column] = widths[column]
            after = order[rank + 1 :]
            for other in after:
                shares[other] += excess / len(after)
    return [int(share) for share in shares]


def _chunks(text: str, width: int) -> list[str]:
    return [text[i : i + width] for i in range(0, len(text), width)] or [""]


def format_model_table(entries: Sequence[RepositoryEntry]) -> str:
    """``+-------+---------+--------+`` framed rows of model, version and status. Models never
    asked to load (explicit mode) are left out, as tritonserver does."""
    shown = [e for e in entries if e.state or e.reason]
    rows = [_HEADER] + [(e.name, e.version or "-", _status(e)) for e in shown]
    widths = _shares([max(len(row[i]) for row in rows) for i in range(3)])
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def lines(row: tuple[str, str, str]) -> list[str]:
        cells = [_chunks(cell, w) for cell, w in zip(row, widths, strict=True)]
        height = max(len(cell) for cell in cells)
        return [
            "| "
            + " | ".join(
                (c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, widths, strict=True)
            )
            + " |"
            for k in range(height)
        ]

    # No models: the header and the closing rule only, as Triton's TablePrinter writes it.
    body = [text for row in rows[1:] for text in lines(row)]
    return "\n".join([rule, *lines(rows[0]), rule, *body, rule])
