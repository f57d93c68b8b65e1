"""``shoal perf``: a closed-loop load generator for any KServe V2 server (HTTP or gRPC).

A client only: it talks to servers over the network and imports nothing of the server.
"""

from shoal.perf.cli import add_arguments, main
from shoal.perf.errors import PerfError, RequestFailed
from shoal.perf.runner import RunConfig, run
from shoal.perf.stats import CellResult, LatencySummary, percentile, summarize
from shoal.perf.sweep import parse_concurrency

__all__ = [
    "CellResult",
    "LatencySummary",
    "PerfError",
    "RequestFailed",
    "RunConfig",
    "add_arguments",
    "main",
    "parse_concurrency",
    "percentile",
    "run",
    "summarize",
]
