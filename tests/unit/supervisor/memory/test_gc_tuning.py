"""The supervisor's garbage-collector setting (shoal/supervisor/memory/gc_tuning.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from shoal.supervisor.memory.gc_tuning import YOUNG_THRESHOLD

pytestmark = pytest.mark.timeout(60)


def test_only_the_youngest_generation_waits_longer() -> None:
    # In a fresh interpreter: the setting is process-wide and must not leak into the tests.
    script = (
        "import gc, json\n"
        "before = gc.get_threshold()\n"
        "from shoal.supervisor.memory.gc_tuning import settle_after_start\n"
        "settle_after_start()\n"
        "print(json.dumps([before, gc.get_threshold(), gc.isenabled()]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=50
    )
    before, after, enabled = json.loads(out.stdout)
    assert after == [YOUNG_THRESHOLD, before[1], before[2]]
    assert before[0] < YOUNG_THRESHOLD
    assert enabled  # cycles are still collected
