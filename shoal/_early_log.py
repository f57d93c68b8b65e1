"""``--log-file`` opened at once, before the imports of the server (about a second): a tool
that waits for the log file to appear (Triton's L0_logging waits 5 s, as for tritonserver,
which opens it among its first steps) sees it while shoal still starts.

Only the standard library is imported here. The command line is read for that flag alone;
the parser checks it all later and :func:`take` hands the open file to the log handler. A
command line the parser then refuses leaves no file it created behind (:func:`abandon`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TextIO

_FLAG = "--log-file"

#: The files opened early, by the path given, and whether they were created here.
_opened: dict[str, tuple[TextIO, bool]] = {}


def log_file_flag(argv: Sequence[str]) -> str:
    """The last ``--log-file`` value of a ``serve`` command line ("" if none), as the parser
    reads it (``--log-file FILE`` or ``--log-file=FILE``)."""
    if "serve" not in argv:
        return ""
    path = ""
    for index, arg in enumerate(argv):
        if arg == _FLAG and index + 1 < len(argv):
            path = argv[index + 1]
        elif arg.startswith(_FLAG + "="):
            path = arg[len(_FLAG) + 1 :]
    return path


def open_early(argv: Sequence[str]) -> None:
    """Open (create, to append) the command line's log file; a failure is left for the log
    setup to report, once the flags are known to be right."""
    path = log_file_flag(argv)
    if not path or path in _opened:
        return
    created = not os.path.exists(path)
    try:
        _opened[path] = (open(path, "a", encoding="utf-8"), created)  # noqa: SIM115
    except OSError:
        return


def take(path: str) -> TextIO | None:
    """The file opened early for ``path``, now the caller's (None if it was not)."""
    entry = _opened.pop(path, None)
    return entry[0] if entry else None


def abandon() -> None:
    """The command line was refused: close the files opened early, and remove those created
    here that are still empty."""
    for path, (stream, created) in list(_opened.items()):
        stream.close()
        if created and os.path.getsize(path) == 0:
            os.unlink(path)
    _opened.clear()
