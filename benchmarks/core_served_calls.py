"""Interpreted Python calls per request in a served core process: a count load cannot move.

    .venv/bin/python -m benchmarks.core_served_calls [--requests 2000] [--frontend-workers 2]

Runs ``shoal serve`` (``--frontend-workers N``) with a profile hook that counts, between two
signals, every Python frame the core process runs, by function; drives HTTP requests to
``identity_fp32`` (64 B) from a few tritonclient threads (``core_profile``'s driver) after a
warm-up, and prints the calls per request. With the hot path compiled, what is left is what
mypyc did not compile.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import shoal._compiled
from benchmarks.core_profile import _drive, core_arguments, warm_core


def _serve() -> None:
    """The server side (``--serve OUT ...``): counts frames between SIGUSR1 and SIGUSR2."""
    out = sys.argv[2]
    counts: collections.Counter[str] = collections.Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            counts[f"{code.co_filename.rsplit('/', 1)[-1]} {code.co_qualname}"] += 1

    def start(*_: object) -> None:
        sys.setprofile(profile)

    def stop(*_: object) -> None:
        sys.setprofile(None)
        Path(out).write_text(json.dumps(counts))

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = ["shoal", *sys.argv[sys.argv.index("serve") :]]
    from shoal.cli import main

    main()


def main() -> None:
    args = core_arguments(__doc__, 2000).parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/counts.json"
        wrapper = [sys.executable, "-m", "benchmarks.core_served_calls", "--serve", out]
        with warm_core(Path(tmp) / "serve.log", args.frontend_workers, wrapper=wrapper) as server:
            os.kill(server.process.pid, signal.SIGUSR1)
            _drive(server.http, args.requests)
            os.kill(server.process.pid, signal.SIGUSR2)
            _drive(server.http, 4)  # the handler runs at the loop's next turn
        counts: dict[str, int] = json.loads(Path(out).read_text())
    per = args.requests
    total = sum(counts.values()) / per
    print(f"# core process, --frontend-workers {args.frontend_workers}, {per} HTTP requests,")
    print(f"# hot path {shoal._compiled.state}: Python calls per request {total:.1f}")
    for name, count in sorted(counts.items(), key=lambda item: -item[1])[:30]:
        print(f"{count / per:8.2f}  {name}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        _serve()
    else:
        main()
