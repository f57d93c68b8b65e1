import csv
import json
import sys

import pytest

from shoal.perf.report import format_table, plot, write_csv, write_json
from shoal.perf.stats import summarize

pytestmark = pytest.mark.timeout(10)


def _result(concurrency: int, errors: int = 0, samples=()):
    return summarize(
        model="m",
        protocol="http",
        client="python",
        concurrency=concurrency,
        duration_s=1.0,
        latencies_ns=[1_000_000 * concurrency] * 10,
        errors=errors,
        error_samples=samples,
    )


def test_table_has_one_row_per_level_and_the_error_samples():
    table = format_table([_result(1), _result(8, errors=2, samples=("RequestFailed: no",))])
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["concurrency", "infer/s", "resp/s"]
    assert lines[1].split()[0] == "1" and lines[2].split()[0] == "8"
    assert lines[-1] == "  error at concurrency 8: RequestFailed: no"


def test_json_and_csv(tmp_path):
    results = [_result(1), _result(8)]
    write_json(results, tmp_path / "r.json", {"model": "m"})
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["model"] == "m"
    assert [c["throughput"] for c in document["cells"]] == [10.0, 10.0]
    assert document["cells"][1]["p50_ms"] == 8.0
    write_csv(results, tmp_path / "r.csv")
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert [r["concurrency"] for r in rows] == ["1", "8"]
    assert float(rows[0]["p99_ms"]) == 1.0


def test_plot_is_skipped_with_a_note_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes the import fail
    note = plot([_result(1), _result(8)], tmp_path / "p.png", "t")
    assert "matplotlib is not installed" in note
    assert not (tmp_path / "p.png").exists()


def test_plot_is_drawn_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    note = plot([_result(1), _result(8)], tmp_path / "p.png", "t")
    assert note.startswith("plot written")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
