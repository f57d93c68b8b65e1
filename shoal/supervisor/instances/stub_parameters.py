"""The model parameters that shape an instance's stub: its thread pools, its execute timeout and
how many batches an ``async def execute`` runs at once."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("shoal")

#: Thread-pool sizes a stub may be given (torch follows OMP_NUM_THREADS).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: The model parameter that asks shoal to size them: ``auto`` (the CPUs this server may use
#: divided by the model's instance count) or a number of threads.
THREADS_PARAMETER = "SHOAL_THREADS_PER_INSTANCE"


def thread_env(
    parameters: Any, instances: int, environ: Any = os.environ, cpus: int | None = None
) -> dict[str, str]:
    """Thread counts set for a model's stubs: none unless asked, as in Triton, where a stub
    inherits the server's environment. A model asks with a parameter of a variable's own name
    (that value) or with ``SHOAL_THREADS_PER_INSTANCE`` (every variable the server's
    environment leaves unset)."""
    env = {name: str(parameters[name]) for name in THREAD_VARIABLES if name in parameters}
    asked = str(parameters.get(THREADS_PARAMETER, "")).strip().lower()
    share = _thread_share(asked, instances, cpus) if asked else None
    for name in THREAD_VARIABLES:
        if share is not None and name not in env and name not in environ:
            env[name] = share
    return env


def _thread_share(asked: str, instances: int, cpus: int | None) -> str | None:
    """The threads each stub gets for ``SHOAL_THREADS_PER_INSTANCE`` = ``asked`` (None: not a
    valid value, ignored)."""
    if asked == "auto":
        if cpus is None:
            cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        return str(max(1, (cpus or os.cpu_count() or 1) // max(1, instances)))
    if asked.isdigit() and int(asked) > 0:
        return asked
    log.warning(
        "%s must be 'auto' or a positive number of threads, not %r; ignored",
        THREADS_PARAMETER,
        asked,
    )
    return None


EXECUTE_TIMEOUT_PARAMETER = "execute_timeout_seconds"


def execute_timeout(parameters: Mapping[str, str], model: str) -> float | None:
    """The model's ``execute_timeout_seconds`` parameter (a stuck execute kills its stub)."""
    raw = parameters.get(EXECUTE_TIMEOUT_PARAMETER)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        log.warning(
            "model '%s': %s must be a number of seconds, not %r; ignored",
            model,
            EXECUTE_TIMEOUT_PARAMETER,
            raw,
        )
        return None
    return value if value > 0 else None


ASYNC_CONCURRENCY_PARAMETER = "async_execute_concurrency"


def async_concurrency(parameters: Mapping[str, str], model: str) -> int:
    """How many batches an ``async def execute`` instance runs at once: 1 unless the model
    asks for more, as Triton runs a non-decoupled coroutine to completion before the next
    batch (the stub reads the same parameter)."""
    raw = parameters.get(ASYNC_CONCURRENCY_PARAMETER)
    if not raw:
        return 1
    try:
        return max(1, int(raw))
    except ValueError:
        log.warning(
            "model '%s': %s must be an integer, not %r; using 1",
            model,
            ASYNC_CONCURRENCY_PARAMETER,
            raw,
        )
        return 1
