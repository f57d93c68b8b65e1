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


def test_a_long_reason_goes_on_over_the_next_lines_as_tritonservers_does() -> None:
    reason = 'Resource count for "r1" is limited to 1 ' + "x" * 600
    lines = format_model_table([RepositoryEntry("m", "1", "UNAVAILABLE", reason)]).splitlines()
    # Triton's 500 columns: "Model" and "Version" as wide as they need, the rest of the three
    # equal shares (163 each, of the 491 inside the frame) for the status.
    assert {len(line) for line in lines} == {499}
    rows = lines[3:-1]
    assert len(rows) == 2 and rows[1].startswith("|       |         | x")
    status = "".join(row.split("|")[3][1:-1] for row in rows).rstrip()
    assert status == "UNAVAILABLE: " + reason  # nothing cut: a log grep finds the whole reason


def test_an_empty_table_has_no_row() -> None:
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
