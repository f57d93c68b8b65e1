"""Unpacking environment tarballs: absolute links are kept, nothing lands outside the cache."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from shoal.supervisor.models.environments import _keep_absolute_links


def _archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return path


def _link(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, None


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def test_absolute_links_unpack_as_they_are(tmp_path):
    archive = _archive(
        tmp_path / "env.tar.gz",
        [_link("bin/python", "/usr/bin/python3"), _file("lib/x.py", b"X = 1\n")],
    )
    dest = tmp_path / "out"
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter=_keep_absolute_links)
    assert (dest / "bin" / "python").readlink() == Path("/usr/bin/python3")
    assert (dest / "lib" / "x.py").read_text() == "X = 1\n"


@pytest.mark.parametrize(
    "evil",
    [
        lambda sink: [_link("escape", str(sink)), _file("escape/planted", b"no")],  # via a link
        lambda sink: [_file("../sink/planted", b"no")],
        lambda sink: [_link("../sink/planted", "/usr/bin/python3")],  # the link itself outside
    ],
)
def test_nothing_is_written_outside_the_destination(tmp_path, evil):
    sink = tmp_path / "sink"
    sink.mkdir()
    archive = _archive(tmp_path / "evil.tar.gz", evil(sink))
    dest = tmp_path / "out"
    dest.mkdir()
    with tarfile.open(archive) as tar, pytest.raises(tarfile.FilterError):
        tar.extractall(dest, filter=_keep_absolute_links)
    assert not (sink / "planted").exists() and not (sink / "planted").is_symlink()
