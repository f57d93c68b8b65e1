"""Entry point of a stub: ``python -m shoal.stub --socket FD --channel FD,... --parent PID``.

The supervisor spawns one stub per model instance. The stub never talks to clients.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys

from shoal.stub.runtime import StubRuntime, die_with_parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shoal.stub")
    parser.add_argument(
        "--socket", type=int, required=True, help="fd of the instance's Unix socket"
    )
    parser.add_argument("--channel", required=True, help="comma-separated channel fds")
    parser.add_argument("--parent", type=int, required=True, help="supervisor pid")
    parser.add_argument("--instance", required=True, help="instance name, for messages")
    args = parser.parse_args(argv)
    # The model's process is its own: Triton's stub embeds Python with an empty argv, and
    # models run argparse or unittest.main() on it, so they must not see the stub's flags.
    sys.argv[:] = [""]
    die_with_parent(args.parent)
    # `kill -USR1 <stub pid>` prints every thread's stack to the server log: hung models.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    channel_fds = [int(fd) for fd in args.channel.split(",")]
    runtime = StubRuntime(args.instance, args.socket, channel_fds, args.parent)
    profile_dir = os.environ.get("SHOAL_STUB_PROFILE")
    if not profile_dir:
        return runtime.run()
    # For developers: SHOAL_STUB_PROFILE=<dir> writes each stub's cProfile stats at exit.
    import cProfile

    profiler = cProfile.Profile()
    try:
        return profiler.runcall(runtime.run)
    finally:
        profiler.dump_stats(os.path.join(profile_dir, f"{args.instance}.{os.getpid()}.prof"))


if __name__ == "__main__":
    sys.exit(main())
