"""One loaded model version's record: config, scheduler, instances and state.

Compiled (``shoal/_compiled.py``): the core reads a version's fields on every request (its
summary, statistics, scheduler, state), and reads of an interpreted object's attributes from
compiled code are generic lookups in CPython; here they are native struct reads.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from shoal.config import ModelConfig
from shoal.supervisor.extensions.statistics import StatsRecorder
from shoal.supervisor.instances.instance import StubInstance
from shoal.supervisor.models import environments
from shoal.supervisor.requests.summary import ModelSummary
from shoal.supervisor.schedulers.base import Scheduler
from shoal.supervisor.schedulers.rate_limiter import LimitedInstance
from shoal.supervisor.work import Work


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    UNLOADING = "UNLOADING"


@dataclass(eq=False)
class ModelVersion:
    """One version of a model: config, scheduler and instances."""

    name: str
    version: int
    config: ModelConfig
    config_json: dict[str, Any]
    state: ModelState = ModelState.LOADING
    reason: str = ""
    scheduler: Scheduler | None = None
    instances: list[StubInstance] = field(default_factory=list)
    stats: StatsRecorder = field(init=False)
    environment: environments.StubEnvironment | None = None
    #: The ``model.py`` of the model's Python-based backend; "" when the model is its own.
    runtime_file: str = ""
    #: Its instances' places in the rate limiter (``--rate-limit execution_count``).
    rate_limited: list[LimitedInstance] = field(default_factory=list)
    #: Why no instance is live while every restart keeps failing (None when one is live or
    #: about to be): requests are refused with it instead of waiting for an instance.
    down: str | None = None
    #: Its version directory's files when it loaded (``instance_update.version_files``).
    files: tuple[object, ...] = ()
    #: Each instance's signature, in ``instances``' order, once an in-place update has made
    #: that order differ from the configuration's (``instance_update``); empty before.
    instance_keys: list[bytes] = field(default_factory=list)
    #: Instances an update removed that still hold sequences (stopped when those end).
    retiring: list[StubInstance] = field(default_factory=list)
    #: ``config.is_ensemble``, and neither an ensemble nor decoupled: asked on every request,
    #: read once here (the config's properties are interpreted calls; it never changes).
    is_ensemble: bool = field(init=False)
    plain: bool = field(init=False)
    #: What the per-request checks read of ``config``, in native attributes (built once).
    summary: ModelSummary = field(init=False)
    #: ``str(version)``, as every response names it.
    version_label: str = field(init=False)
    #: An ensemble's step graph (``ensemble.EnsemblePlan``), worked out on its first request;
    #: kept here, not in a weak map: a compiled class cannot be weakly referenced.
    ensemble_plan: Any = field(init=False)

    def __post_init__(self) -> None:
        self.stats = StatsRecorder(self.name, self.version)
        self.is_ensemble = self.config.is_ensemble
        self.plain = not (self.is_ensemble or self.config.decoupled)
        self.summary = ModelSummary(self.config)
        self.version_label = str(self.version)
        # Set here, not as the field's default: compiled, an ``init=False`` field's default is
        # never assigned (no class attribute to fall back on).
        self.ensemble_plan = None

    @property
    def ready(self) -> bool:
        """Loaded (it may be between two stubs of a restart: see ``serving``)."""
        return self.state is ModelState.READY

    @property
    def serving(self) -> bool:
        """Loaded and with a live instance now: what readiness reports."""
        if self.state is not ModelState.READY:
            return False
        return not self.instances or any(i.ready for i in self.instances)

    def submit(self, work: Work) -> None:
        assert self.scheduler is not None
        self.scheduler.submit(work)
