"""What one ``/metrics`` scrape costs the core's loop with many model versions.

    .venv/bin/python -m benchmarks.metrics_scrape                     # 1,000 versions x 300
    .venv/bin/python -m benchmarks.metrics_scrape --versions 100 --observations 1000 --profile

A scrape runs on the core's event loop: no request is served while it runs. This builds the
families a scrape renders for ``--versions`` versions, from the same recorders the versions
keep (``StatsRecorder``, each fed ``--observations`` successes of spread-out durations), and
times :func:`render_text` over them, in CPU milliseconds (median of ``--repeat``):

* ``counters``: Triton's per-model families only (``--metrics-config`` left at its defaults,
  summaries off), as :class:`ServiceCollector` builds them from each version's statistics;
* ``summaries, first``: ``summary_latencies=true``, the first scrape after the observations;
* ``summaries, again``: the next scrape, nothing observed in between;
* ``summaries, busy``: a scrape after one new observation in every version (a loaded server:
  every summary changed since the last scrape).

``--profile`` prints cProfile's top entries of one scrape of each kind.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import time
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import Metric

from shoal.supervisor.extensions._metrics_families import ModelSample, render_text, triton_families
from shoal.supervisor.extensions.latency_families import (
    LatencySettings,
    VersionLatencies,
    latency_families,
)
from shoal.supervisor.extensions.statistics import StatsRecorder

US = 1000


def _recorders(count: int, observations: int, summaries: bool) -> list[StatsRecorder]:
    rng = random.Random(7)
    recorders = []
    for index in range(count):
        recorder = StatsRecorder(f"model_{index}", 1)
        if summaries:
            recorder.latencies = VersionLatencies(LatencySettings(summaries=True), cached=False)
        for _ in range(observations):
            infer = int(rng.lognormvariate(7, 1.2)) * US  # ~1 ms, from tens of us to tens of ms
            queue = int(rng.lognormvariate(4, 1)) * US
            recorder.execution(1, (20 * US, infer, 15 * US))
            recorder.success(1, infer + queue + 50 * US, queue, (20 * US, infer, 15 * US))
        recorders.append(recorder)
    return recorders


def _families(recorders: list[StatsRecorder]) -> Iterator[Metric]:
    samples = [ModelSample(r.snapshot()) for r in recorders]
    yield from triton_families(samples, True)
    latencies = [
        ({"model": f"model_{index}", "version": "1"}, r.latencies)
        for index, r in enumerate(recorders)
        if r.latencies is not None
    ]
    yield from latency_families(latencies)


def _scrape_ms(recorders: list[StatsRecorder]) -> float:
    """CPU milliseconds of one scrape (the loop's time on a machine with a core to spare; a
    shared, loaded machine stretches the wall time by how busy it is)."""
    started = time.process_time()
    render_text(_families(recorders))
    return (time.process_time() - started) * 1000


def _median_ms(repeat: int, before: Callable[[], None], recorders: list[StatsRecorder]) -> float:
    times = []
    for _ in range(repeat):
        before()
        times.append(_scrape_ms(recorders))
    return statistics.median(times)


def _profile(title: str, recorders: list[StatsRecorder]) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    render_text(_families(recorders))
    profiler.disable()
    print(f"--- profile: {title}")
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=1000)
    parser.add_argument("--observations", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    plain = _recorders(args.versions, args.observations, summaries=False)
    counters = _median_ms(args.repeat, lambda: None, plain)
    summed = _recorders(args.versions, args.observations, summaries=True)
    first = _scrape_ms(summed)
    again = _median_ms(args.repeat, lambda: None, summed)

    def observe_one() -> None:
        for recorder in summed:
            recorder.success(1, 900 * US, 40 * US, (20 * US, 800 * US, 15 * US))

    busy = _median_ms(args.repeat, observe_one, summed)
    print(f"{args.versions} versions, {args.observations} observations each")
    print(f"counters (summaries off):  {counters:8.1f} ms")
    print(f"summaries, first:          {first:8.1f} ms")
    print(f"summaries, again:          {again:8.1f} ms")
    print(f"summaries, busy:           {busy:8.1f} ms")
    if args.profile:
        _profile("counters", plain)
        observe_one()
        _profile("summaries, busy", summed)


if __name__ == "__main__":
    main()
