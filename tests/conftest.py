"""Fixtures shared by all tests: leak checks for /dev/shm segments and stray stub processes."""

from __future__ import annotations

import os

import pytest


def shoal_shm_segments() -> set[str]:
    try:
        return {name for name in os.listdir("/dev/shm") if "shoal" in name}
    except FileNotFoundError:
        return set()


def stub_processes() -> set[int]:
    """Pids of running ``python -m shoal.stub`` processes."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")
        except OSError:
            continue
        if b"shoal.stub" in cmdline:
            found.add(int(entry))
    return found


@pytest.fixture(autouse=True, scope="session")
def _nothing_left_behind():
    before_shm = shoal_shm_segments()
    yield
    leaked = shoal_shm_segments() - before_shm
    assert not leaked, f"tests left shared-memory segments behind: {sorted(leaked)}"
    stray = stub_processes()
    assert not stray, f"tests left stub processes running: {sorted(stray)}"
