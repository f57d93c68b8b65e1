"""The ``shoal`` command's entry point: the log file opened before the server's imports."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from shoal import _early_log

    _early_log.open_early(sys.argv[1:] if argv is None else argv)
    from shoal.cli import main as cli_main

    return cli_main(argv)
