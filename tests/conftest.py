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
    """Pids of ``python -m shoal.stub`` processes this test session is responsible for: those whose
    supervisor is gone (orphans) or is a child of this process."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")
        except OSError:
            continue
        if b"shoal.stub" in cmdline and b"--parent" in cmdline:
            parent = int(cmdline[cmdline.index(b"--parent") + 1])
            if _parent_of(parent) in (None, os.getpid()):
                found.add(int(entry))
    return found


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@pytest.fixture(autouse=True, scope="session")
def _nothing_left_behind():
    before_shm = shoal_shm_segments()
    yield
    leaked = shoal_shm_segments() - before_shm
    assert not leaked, f"tests left shared-memory segments behind: {sorted(leaked)}"
    stray = stub_processes()
    assert not stray, f"tests left stub processes running: {sorted(stray)}"
