"""What a run leaves behind: a table on stdout, JSON and CSV files, a latency/throughput plot."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shoal.perf.stats import CellResult

_COLUMNS = (
    ("concurrency", "{:>11}"),
    ("infer/s", "{:>10.1f}"),
    ("resp/s", "{:>10.1f}"),
    ("p50 ms", "{:>8.3f}"),
    ("p90 ms", "{:>8.3f}"),
    ("p99 ms", "{:>8.3f}"),
    ("errors", "{:>7}"),
    ("client CPU %", "{:>12.0f}"),
)


def row(result: CellResult) -> dict[str, Any]:
    """One flat record per cell: the CSV row, and each entry of the JSON ``cells`` list."""
    record = asdict(result)
    latency = record.pop("latency_ms")
    record["error_samples"] = list(result.error_samples)
    record["throughput"] = result.throughput
    record["responses_per_s"] = result.responses_per_s
    record.update({f"{key}_ms": value for key, value in latency.items()})
    return record


def format_table(results: Sequence[CellResult]) -> str:
    names = [name for name, _ in _COLUMNS]
    widths = [max(len(name), len(fmt.format(0))) for name, fmt in _COLUMNS]
    header = "  ".join(name.rjust(width) for name, width in zip(names, widths, strict=True))
    rows = [_row(result, widths) for result in results]
    return "\n".join([header, *rows, *_error_lines(results)])


def _row(result: CellResult, widths: list[int]) -> str:
    cells = [
        fmt.format(value).rjust(width)
        for (_, fmt), value, width in zip(_COLUMNS, _values(result), widths, strict=True)
    ]
    return "  ".join(cells)


def _error_lines(results: Sequence[CellResult]) -> list[str]:
    return [
        f"  error at concurrency {result.concurrency}: {sample}"
        for result in results
        for sample in result.error_samples
    ]


def _values(result: CellResult) -> tuple[float, ...]:
    """A row of the table, in the order of ``_COLUMNS``."""
    return (
        result.concurrency,
        result.throughput,
        result.responses_per_s,
        result.latency_ms.p50,
        result.latency_ms.p90,
        result.latency_ms.p99,
        result.errors,
        result.client_cpu_percent,
    )


def write_json(results: Sequence[CellResult], path: Path, meta: dict[str, Any]) -> None:
    document = {**meta, "cells": [row(r) for r in results]}
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")


def write_csv(results: Sequence[CellResult], path: Path) -> None:
    rows = [row(r) for r in results]
    if not rows:
        path.write_text("")
        return
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        for record in rows:
            record["error_samples"] = " | ".join(record["error_samples"])
            writer.writerow(record)


def plot(results: Sequence[CellResult], path: Path, title: str) -> str:
    """Draw p50 and p99 latency against throughput; return a line saying what was done."""
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]

        matplotlib.use("Agg")
        from matplotlib import pyplot  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return f"matplotlib is not installed: no plot written to {path}"
    _save(pyplot, results, path, title)
    return f"plot written to {path}"


def _save(pyplot: Any, results: Sequence[CellResult], path: Path, title: str) -> None:
    figure, axes = pyplot.subplots(figsize=(6.4, 4.0))
    _draw(axes, results, title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def _draw(axes: Any, results: Sequence[CellResult], title: str) -> None:
    throughput = [r.throughput for r in results]
    for name in ("p50", "p99"):
        axes.plot(throughput, [getattr(r.latency_ms, name) for r in results], "o-", label=name)
    for result in results:
        axes.annotate(
            f"c={result.concurrency}",
            (result.throughput, result.latency_ms.p50),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=8,
        )
    _label(axes, title)


def _label(axes: Any, title: str) -> None:
    axes.set_xlabel("throughput (infer/s)")
    axes.set_ylabel("latency (ms)")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
