"""One mapped shared-memory segment: memfd (passed as an fd) or a named POSIX object."""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets

import posix_ipc

PAGE = mmap.PAGESIZE
# MAP_POPULATE makes the kernel fault every page in at mmap time, so the first write on the hot
# path runs at memcpy speed instead of paying a page fault per 4 KiB.
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def page_align(nbytes: int) -> int:
    return (nbytes + PAGE - 1) // PAGE * PAGE


def segment_name(arena_id: int, index: int, pid: int | None = None) -> str:
    """POSIX name of a named segment: the owner's pid (so stale ones can be swept) and 64 random
    bits, so that no other local user can guess a name and create it first."""
    owner = os.getpid() if pid is None else pid
    return f"/shoal-{owner}-{secrets.token_hex(8)}-{arena_id}-{index}"


# Also the names of earlier releases (no random part), so their stale segments are swept too.
_NAMED = re.compile(r"shoal-(\d+)(?:-[0-9a-f]{16})?-\d+-\d+")


def remove_stale_segments(shm_dir: str = "/dev/shm") -> list[str]:
    """Unlink named arena segments whose owner process is gone; returns the names removed.

    A supervisor calls this at start: a crashed one cannot have unlinked its own segments.
    """
    removed = []
    for entry in sorted(os.listdir(shm_dir)):
        if not _stale(entry):
            continue
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory("/" + entry)
            removed.append("/" + entry)
    return removed


def _stale(entry: str) -> bool:
    """A named arena segment whose owner process is gone."""
    match = _NAMED.fullmatch(entry)
    return match is not None and not _alive(int(match[1]))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


class Segment:
    """A shared-memory mapping; ``buf`` is a writable memoryview of the whole of it.

    ``fd`` is set for memfd segments (the owner keeps it to pass to peers), ``name`` for named
    POSIX ones. ``close()`` unmaps, closes the fd and, for the creator of a named segment,
    unlinks it.
    """

    def __init__(
        self,
        arena_id: int,
        index: int,
        size: int,
        mapping: mmap.mmap,
        *,
        fd: int | None = None,
        name: str | None = None,
        unlink: bool = False,
    ) -> None:
        self.arena_id = arena_id
        self.index = index
        self.size = size
        self.fd = fd
        self.name = name
        self._mapping: mmap.mmap | None = mapping
        self._unlink = unlink
        self.buf = memoryview(mapping)

    @property
    def closed(self) -> bool:
        return self._mapping is None

    def close(self) -> None:
        mapping, self._mapping = self._mapping, None
        if mapping is None:
            return
        self.buf.release()
        # Views handed out (e.g. NumPy arrays over a block) keep the mapping exported; then the
        # mapping is unmapped when the last of them is collected instead of now.
        with contextlib.suppress(BufferError):
            mapping.close()
        self._close_fd()
        self._unlink_name()

    def _close_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _unlink_name(self) -> None:
        if self._unlink and self.name is not None:
            with contextlib.suppress(posix_ipc.ExistentialError):
                posix_ipc.unlink_shared_memory(self.name)


def _map(fd: int, size: int) -> mmap.mmap:
    return mmap.mmap(
        fd,
        size,
        flags=mmap.MAP_SHARED | _POPULATE,
        prot=mmap.PROT_READ | mmap.PROT_WRITE,
    )


def create_memfd(arena_id: int, index: int, size: int) -> Segment:
    fd = os.memfd_create(f"shoal-arena-{arena_id}-{index}", os.MFD_CLOEXEC)
    try:
        # fallocate reserves the pages now: running out of memory is an error here, not a SIGBUS
        # on some later write.
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
        return Segment(arena_id, index, size, _map(fd, size), fd=fd)
    except BaseException:
        os.close(fd)
        raise


def create_named(arena_id: int, index: int, size: int) -> Segment:
    name = segment_name(arena_id, index)
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
    try:
        os.posix_fallocate(shm.fd, 0, size)
        mapping = _map(shm.fd, size)
    except BaseException:
        shm.close_fd()
        posix_ipc.unlink_shared_memory(name)
        raise
    shm.close_fd()
    return Segment(arena_id, index, size, mapping, name=name, unlink=True)


def map_fd(arena_id: int, index: int, fd: int, size: int) -> Segment:
    """Map a peer's memfd segment; the segment owns ``fd`` from now on (it is kept for
    :func:`private_view`)."""
    try:
        mapping = _map(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return Segment(arena_id, index, size, mapping, fd=fd)


def private_view(fd: int, offset: int, nbytes: int) -> memoryview:
    """A writable copy-on-write view of ``nbytes`` at ``offset`` of the file ``fd``.

    A ``MAP_PRIVATE`` mapping reads the shared pages in place; a write copies just the page it
    touches into memory of this process, so no other mapping of the file ever sees it. The
    mapping lives as long as the returned view (or any array over it).
    """
    start = offset - offset % PAGE
    mapping = mmap.mmap(
        fd,
        offset + nbytes - start,
        flags=mmap.MAP_PRIVATE,
        prot=mmap.PROT_READ | mmap.PROT_WRITE,
        offset=start,
    )
    return memoryview(mapping)[offset - start :]


def map_named(arena_id: int, index: int, name: str, size: int) -> Segment:
    shm = posix_ipc.SharedMemory(name)
    try:
        mapping = _map(shm.fd, size)
    finally:
        shm.close_fd()
    return Segment(arena_id, index, size, mapping, name=name)
