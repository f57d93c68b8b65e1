"""Security basics of issue #9 item 9 (docs/security.md).

* Nothing that can run code when it decodes crosses a process boundary: no module of shoal
  imports pickle or its relatives, and the one IPC codec (msgpack, ``shoal/ipc/messages.py``)
  decodes to plain data only.
* Named shared-memory segments (the ``posix`` arena backend; the default is memfd, which has no
  name at all) are created exclusively, readable and writable by their owner only, with names
  another local user cannot guess.
"""

from __future__ import annotations

import ast
import os
import pickle  # only to build a hostile payload
import stat
from pathlib import Path

import msgpack
import pytest

from shoal.ipc import messages
from shoal.ipc.arena import OwnedArena

SHOAL = Path(__file__).resolve().parents[2] / "shoal"

#: Serializers that can build arbitrary objects (and so run code) when they decode, and modules
#: whose IPC uses them (multiprocessing's queues and connections pickle).
UNSAFE_MODULES = {
    "pickle",
    "_pickle",
    "cPickle",
    "pickletools",
    "copyreg",
    "marshal",
    "shelve",
    "dill",
    "cloudpickle",
    "joblib",
    "jsonpickle",
    "multiprocessing",
}


def _python_files() -> list[Path]:
    # Generated protobuf modules are data descriptions; they are scanned too.
    return sorted(SHOAL.rglob("*.py"))


def _unsafe_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "__import__" and node.args:
                arg = node.args[0]
                names = [arg.value] if isinstance(arg, ast.Constant) else ["<dynamic>"]
        elif (
            isinstance(node, ast.keyword)
            and node.arg == "allow_pickle"
            and not (isinstance(node.value, ast.Constant) and node.value.value is False)
        ):
            found.append(f"{path.relative_to(SHOAL.parent)}:{node.lineno} allow_pickle")
        for name in names:
            if name.split(".")[0] in UNSAFE_MODULES or name == "<dynamic>":
                found.append(f"{path.relative_to(SHOAL.parent)}:{node.lineno} {name}")
    return found


def test_no_pickle_anywhere_in_shoal():
    files = _python_files()
    assert len(files) > 100, "the scan found too few modules: wrong root?"
    found = [use for path in files for use in _unsafe_uses(path)]
    assert not found, f"pickle-like serializers in shoal: {found}"


def test_the_scan_sees_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nfrom multiprocessing import Queue\nimport numpy as np\n"
        "np.load('x', allow_pickle=True)\n__import__('marshal')\n"
    )
    assert len(_unsafe_uses_outside(bad)) == 4


def _unsafe_uses_outside(path: Path) -> list[str]:
    global SHOAL
    saved, SHOAL = SHOAL, path.parent
    try:
        return _unsafe_uses(path)
    finally:
        SHOAL = saved


class _Boom:
    """Unpickling this would run a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("kind", sorted(messages._TYPES))
def test_ipc_messages_decode_to_plain_data_only(tmp_path, kind):
    """A peer that sends a pickle, or msgpack extension types, gets nothing run: shoal's codec
    has no object hook, and a message is rebuilt from plain fields or refused."""
    marker = tmp_path / "ran"
    hostile = pickle.dumps(_Boom(marker))
    fields = [hostile, msgpack.ExtType(1, hostile), {"x": msgpack.ExtType(2, hostile)}] * 4
    payload = msgpack.packb([kind, *fields], use_bin_type=True)
    try:
        messages.decode(payload)
    except (ValueError, TypeError, IndexError, KeyError, AttributeError):
        pass  # refused: a malformed message
    assert not marker.exists()
    decoded = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    assert isinstance(decoded[2], msgpack.ExtType)  # stays inert data


@pytest.mark.timeout(10)
def test_named_segments_are_private_to_their_owner():
    with OwnedArena(
        7, initial_bytes=1 << 16, growth_bytes=1 << 16, limit_bytes=1 << 18, backend="posix"
    ) as arena:
        arena.allocate(1 << 16)
        arena.allocate(1 << 16)  # does not fit the first segment: a second one is created
        names = [segment.name for segment in arena.segments]
        assert len(names) == 2
        for name in names:
            assert name is not None
            info = os.stat("/dev/shm" + name)
            assert stat.S_IMODE(info.st_mode) == 0o600, f"{name}: {oct(info.st_mode)}"
            assert info.st_uid == os.getuid()


@pytest.mark.timeout(10)
def test_named_segment_names_are_unguessable():
    """Two arenas with the same id in the same process must not get the same segment name, and
    a name must carry at least 64 random bits."""
    settings = {"initial_bytes": 1 << 16, "growth_bytes": 1 << 16, "limit_bytes": 1 << 16}
    with OwnedArena(9, backend="posix", **settings) as first:
        name = first.segments[0].name
    with OwnedArena(9, backend="posix", **settings) as second:
        again = second.segments[0].name
    assert name != again
    assert name is not None
    predictable = f"/shoal-{os.getpid()}-9-0"
    assert len(name) >= len(predictable) + 16  # 64 bits as hex
