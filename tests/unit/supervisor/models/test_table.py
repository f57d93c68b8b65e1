"""The model table logged at start, framed as tritonserver's."""

from __future__ import annotations

import pytest

from shoal.core.types import RepositoryEntry
from shoal.supervisor.models.table import format_model_table

pytestmark = pytest.mark.timeout(10)


def test_rows_are_framed_aligned_and_one_line_each() -> None:
    reason = "failed to load 'init_fail' version 1: NameError: x\nmore"
    table = format_model_table(
        [
            RepositoryEntry("add_sub", "1", "READY"),
            RepositoryEntry("init_fail", "1", "UNAVAILABLE", reason),
            RepositoryEntry("broken", "", "UNAVAILABLE", "bad config"),
        ]
    )
    assert table.splitlines() == [
        "+-----------+---------+--------------------------------+",
        "| Model     | Version | Status                         |",
        "+-----------+---------+--------------------------------+",
        "| add_sub   | 1       | READY                          |",
        "| init_fail | 1       | UNAVAILABLE: NameError: x more |",
        "| broken    | -       | UNAVAILABLE: bad config        |",
        "+-----------+---------+--------------------------------+",
    ]


def test_long_reasons_are_cut_and_an_empty_table_has_no_row() -> None:
    (row,) = format_model_table([RepositoryEntry("m", "1", "UNAVAILABLE", "x" * 300)]).splitlines()[
        3:4
    ]
    assert row.endswith("... |") and len(row) < 130
    # No models: Triton's header and closing rule, no row (its TablePrinter adds none).
    empty = [
        "+-------+---------+--------+",
        "| Model | Version | Status |",
        "+-------+---------+--------+",
        "+-------+---------+--------+",
    ]
    assert format_model_table([]).splitlines() == empty
    # Explicit mode: a model in the repository that nobody asked to load has no row.
    assert format_model_table([RepositoryEntry("add_sub")]).splitlines() == empty
