"""glibc malloc tuning: large buffers are reused without page faults once it is applied."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from shoal.supervisor.memory import malloc_tuning

pytestmark = pytest.mark.timeout(60)

_PROBE = textwrap.dedent(
    """
    import resource, sys
    from shoal.supervisor.memory.malloc_tuning import keep_large_buffers_mapped
    applied = keep_large_buffers_mapped() if sys.argv[1] == "tuned" else False
    size = 4 * 1024 * 1024
    keep = []
    for _ in range(3):  # warm up: the heap grows to its working size once
        keep = [bytearray(size), bytearray(size)]
        del keep
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        keep = [bytearray(size), bytearray(size)]  # two live at once, as requests overlap
        del keep
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    print(applied, after - before)
    """
)


def _faults(mode: str) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_reused_buffers_are_not_faulted_in_again():
    applied, faults = _faults("tuned")
    assert applied
    # 40 buffers of 1,024 pages each: untuned, each would be faulted in afresh.
    assert faults < 1024, faults


def test_the_operators_settings_stand(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    assert malloc_tuning.keep_large_buffers_mapped() is False
