"""``python -m shoal.check_compiled``: exit 1 unless this installation of shoal imports its
request hot path compiled. The container image's build runs it after compiling, so that an image
cannot run interpreted (several times slower on small requests) without anyone noticing."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from shoal import _compiled

_WHY = {
    "interpreted": "nothing was compiled: mypyc, a C compiler or the `compile` extra was missing "
    "at install time (install with SHOAL_REQUIRE_COMPILED=1 to see why)",
    "stale": "the compiled modules were built from other sources than those installed",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shoal.check_compiled", description=__doc__)
    parser.add_argument(
        "--allow-interpreted", action="store_true", help="report the state, exit 0 whatever it is"
    )
    args = parser.parse_args(argv)
    print(f"shoal: request hot path {_compiled.state}")
    if _compiled.state == "compiled" or args.allow_interpreted:
        return 0
    print(f"shoal: {_WHY.get(_compiled.state, _compiled.state)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
