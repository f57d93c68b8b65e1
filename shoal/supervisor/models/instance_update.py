"""Triton's in-place instance update: a reload that changes only a version's instance groups.

Triton (``ModelLifeCycle::AsyncLoad``, ``TritonModel::UpdateInstanceGroup``) does not replace a
version that serves when nothing but ``instance_group`` (or ``version_policy``) changed in its
configuration and no file of its version directory did. Each instance the new groups ask for
takes an existing instance of the same *signature* (its group without ``name`` and ``count``,
and its device); the others start (``initialize``), and the existing ones left over stop
(``finalize``, once what they run has finished). The instances kept serve throughout with their
state: no request fails or waits for the update, and no ``initialize`` runs again. Any other
change loads the version anew and swaps it in.

Here the kept instances stay in their version's scheduler: the default scheduler, the dynamic
batcher (one queue for every instance) and the sequence batcher (slots per instance: an added
instance gets slots of its own, a removed one takes no new sequence and stops once the
sequences it holds have ended) are updated in place; an ensemble is reloaded whole.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from shoal.core.errors import InvalidArgument, ShoalError
from shoal.protos import model_config_pb2 as pb
from shoal.supervisor.instances.instance import LoadError, StubInstance
from shoal.supervisor.models import warmup
from shoal.supervisor.models.instance_specs import instance_specs
from shoal.supervisor.models.repository import fingerprint
from shoal.supervisor.models.version import ModelState, ModelVersion
from shoal.supervisor.models.versions import ModelLoader, without_repository
from shoal.supervisor.schedulers import DefaultScheduler, DynamicBatcher, SequenceBatcher
from shoal.supervisor.schedulers.rate_limiter import LimitedInstance

log = logging.getLogger("shoal")

#: Seconds an instance an update removes has to finish what it runs before it is stopped.
RETIRE_TIMEOUT_S = 30.0

#: The instances an update starts, by their place among the wanted ones, with their places in
#: the rate limiter.
Added = dict[int, tuple[StubInstance, LimitedInstance | None]]


@dataclass(frozen=True)
class Wanted:
    """One instance the new configuration asks for: its name, device, signature and group."""

    name: str
    device: int
    key: bytes
    group: pb.ModelInstanceGroup


@dataclass(frozen=True)
class InstancePlan:
    """What an update does: for each wanted instance, the index of the existing instance it
    keeps (None: a new one starts); and the indices of the existing instances that stop."""

    wanted: list[Wanted]
    reuse: list[int | None]
    removed: list[int]

    @property
    def changes(self) -> bool:
        return bool(self.removed) or any(index is None for index in self.reuse)


def wanted_instances(config: pb.ModelConfig) -> list[Wanted]:
    """The instances of ``config``, in ``ModelConfig.instance_names``' order and names."""
    wanted: list[Wanted] = []
    for group in config.instance_group:
        normal = pb.ModelInstanceGroup()
        normal.CopyFrom(group)
        normal.name, normal.count = "", 1  # Triton's signature leaves both out
        base = normal.SerializeToString(deterministic=True)
        devices = list(group.gpus) if group.kind == group.KIND_GPU else [0]
        for index in range(group.count):
            for device in devices:
                key = base + b"@" + str(device).encode()
                wanted.append(Wanted(f"{group.name}_{index}", device, key, group))
    return wanted


def plan_update(current: list[tuple[str, bytes]], wanted: list[Wanted]) -> InstancePlan:
    """Match the wanted instances with the ``current`` ones (name and signature, in the
    version's order): an instance of the same signature and name first, else the last one of
    the same signature (as Triton takes them)."""
    free: dict[bytes, list[int]] = {}
    for index, (_, key) in enumerate(current):
        free.setdefault(key, []).append(index)
    reuse: list[int | None] = []
    for each in wanted:
        candidates = free.get(each.key, [])
        named = [i for i in candidates if current[i][0] == each.name]
        if named:
            candidates.remove(named[0])
            reuse.append(named[0])
        elif candidates:
            reuse.append(candidates.pop())
        else:
            reuse.append(None)
    removed = sorted(i for left in free.values() for i in left)
    return InstancePlan(wanted, reuse, removed)


def version_files(mv: ModelVersion) -> tuple[object, ...]:
    """What tells whether a version's files changed since it loaded: as Triton's
    ``IsModelVersionModified``, its version directory's files and the model directory's other
    files (a module its ``model.py`` imports), not the configuration nor other versions."""
    model_dir = os.path.abspath(mv.config.path)
    own = str(mv.version)
    files = []
    for entry in fingerprint(model_dir):
        top = entry[0].split(os.sep, 1)[0]
        if top == own or not (top.isdigit() or top in _CONFIGURATION):
            files.append(entry)
    return (model_dir, *files)


#: A model directory's configuration: its changes are what an update compares.
_CONFIGURATION = ("config.pbtxt", "configs")


def _without_instances(config: pb.ModelConfig) -> pb.ModelConfig:
    rest = pb.ModelConfig()
    rest.CopyFrom(config)
    rest.ClearField("instance_group")
    rest.ClearField("version_policy")
    return rest


def updatable(old: ModelVersion, new: ModelVersion) -> bool:
    """Whether ``new`` (prepared, not started) can be served by updating ``old``'s instances:
    ``old`` serves, its scheduler shares one queue, and only the instance groups (or the
    version policy) of the configuration changed, none of the version's files."""
    if old.state is not ModelState.READY or old.is_ensemble or not old.instances:
        return False
    if type(old.scheduler) not in (DefaultScheduler, DynamicBatcher, SequenceBatcher):
        return False
    if not old.files or old.files != new.files:
        return False
    return _without_instances(old.config.proto) == _without_instances(new.config.proto)


def current_instances(mv: ModelVersion) -> list[tuple[str, bytes]]:
    """The name and signature of each instance of ``mv``, in its order."""
    keys = mv.instance_keys or [w.key for w in wanted_instances(mv.config.proto)]
    return [(instance.name, key) for instance, key in zip(mv.instances, keys, strict=True)]


def _pairs(
    versions: Iterable[ModelVersion], new: list[ModelVersion]
) -> list[tuple[ModelVersion, ModelVersion]]:
    """The (serving, new) pairs of the same version number that can be updated in place."""
    by_number = {mv.version: mv for mv in versions}
    found = []
    for mv in new:
        mv.files = version_files(mv)
        old = by_number.get(mv.version)
        if old is not None and updatable(old, mv):
            found.append((old, mv))
    return found


async def update_in_place(
    loader: ModelLoader, serving: Iterable[ModelVersion], new: list[ModelVersion]
) -> list[ModelVersion]:
    """Update each serving version that its version in ``new`` only re-instances, and return
    those; raises InvalidArgument when an update failed (the version serves on as it was)."""
    pairs = _pairs(serving, new)
    results = await asyncio.gather(
        *(update_instances(loader, old, mv) for old, mv in pairs), return_exceptions=True
    )
    for (old, _), result in zip(pairs, results, strict=True):
        if isinstance(result, BaseException):
            text = f"failed to update the instances of '{old.name}' version {old.version}"
            log.error("%s: %s", text, result)
            reason = without_repository(f"{text}: {result}", str(old.config.path))
            raise InvalidArgument(f"load failed for model '{old.name}': {reason}")
    return [old for old, _ in pairs]


async def update_instances(loader: ModelLoader, mv: ModelVersion, new: ModelVersion) -> None:
    """Give the serving ``mv`` the instances ``new``'s configuration asks for: the added ones
    start (and warm up) while the kept ones serve, then the left-over ones finish what they
    run and stop. Raises LoadError when an added instance fails to start (``mv`` then serves
    on as it was)."""
    plan = plan_update(current_instances(mv), wanted_instances(new.config.proto))
    new.environment, new.runtime_file = mv.environment, mv.runtime_file
    added = await _start_added(loader, mv, new, plan) if plan.changes else {}
    instances = [
        mv.instances[i] if i is not None else added[n][0] for n, i in enumerate(plan.reuse)
    ]
    limited = loader.rate_limiter is not None  # (then ``rate_limited`` lines up with ``instances``)
    gates = [
        (mv.rate_limited[i] if limited else None) if i is not None else added[n][1]
        for n, i in enumerate(plan.reuse)
    ]
    removed = [mv.instances[i] for i in plan.removed]
    left: list[LimitedInstance | None] = (
        [mv.rate_limited[i] for i in plan.removed] if limited else []
    )
    mv.instances, mv.rate_limited = instances, [g for g in gates if g is not None]
    mv.instance_keys = [w.key for w in plan.wanted]
    mv.config, mv.config_json = new.config, new.config_json
    if added:
        log.info("'%s' version %d: started %d instance(s)", mv.name, mv.version, len(added))
    if removed:
        await _remove(loader, mv, removed, left)
    if added and loader.revoke_routes is not None:
        # Frontend workers send to the instances they were granted: take those routes back,
        # the next grant names the new instances too. Not awaited: a request running on a
        # kept instance would hold the load until it ends.
        _background.add(task := asyncio.ensure_future(loader.revoke_routes(mv)))
        task.add_done_callback(_background.discard)


#: Revocations and retirements under way (a task nobody holds may be collected before it ends).
_background: set[asyncio.Future[None]] = set()


async def _start_added(
    loader: ModelLoader, mv: ModelVersion, new: ModelVersion, plan: InstancePlan
) -> Added:
    """Start the instances ``plan`` adds; on a failure, stop them and raise LoadError."""
    assert mv.scheduler is not None
    specs = instance_specs(new, loader.arenas)
    added: Added = {}
    try:
        for n, wanted in enumerate(plan.wanted):
            if plan.reuse[n] is None:
                gate = _register(loader, mv, wanted)
                added[n] = (StubInstance(specs[n], loader.links(mv, gate, False)), gate)
    except ShoalError:
        _forget(loader, [g for _, g in added.values()])
        raise
    samples = warmup.build_samples(new.config, os.path.abspath(new.config.path))
    warm_up = loader.warm_up_with(mv.name, samples) if samples else None
    scheduler = mv.scheduler
    sequences = scheduler if isinstance(scheduler, SequenceBatcher) else None
    for instance, _ in added.values():
        # One queue for every instance, or (sequences) slots of its own.
        instance.source_index = 0 if sequences is None else sequences.add_instance()
    results = await asyncio.gather(
        *(i.start(scheduler.source(i.source_index), warm_up) for i, _ in added.values()),
        return_exceptions=True,
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        await asyncio.gather(*(i.stop(5.0) for i, _ in added.values()))
        _forget(loader, [g for _, g in added.values()])
        raise errors[0] if isinstance(errors[0], LoadError) else LoadError(repr(errors[0]))
    if sequences is not None:
        for instance, _ in added.values():
            sequences.open_instance(instance.source_index)
    return added


def _register(loader: ModelLoader, mv: ModelVersion, wanted: Wanted) -> LimitedInstance | None:
    if loader.rate_limiter is None:
        return None
    return loader.rate_limiter.register(
        mv.name, wanted.name, wanted.device, wanted.group.rate_limiter
    )


async def _remove(
    loader: ModelLoader,
    mv: ModelVersion,
    removed: list[StubInstance],
    gates: list[LimitedInstance | None],
) -> None:
    """Stop the instances an update left over, once what they run has finished (a sequence
    batcher's, once their sequences have ended: the load does not wait for those)."""
    if isinstance(mv.scheduler, SequenceBatcher):
        mv.retiring.extend(removed)
        for instance, gate in zip(removed, gates or [None] * len(removed), strict=True):
            mv.scheduler.retire_instance(instance.source_index)
            task = asyncio.ensure_future(_retire_sequences(loader, mv, instance, gate))
            _background.add(task)
            task.add_done_callback(_background.discard)
        return
    if loader.revoke_routes is not None:
        await loader.revoke_routes(mv)  # a worker may have sent them requests: let those end
    await asyncio.gather(*(i.retire(RETIRE_TIMEOUT_S) for i in removed))
    _forget(loader, gates)
    log.info("'%s' version %d: stopped %d instance(s)", mv.name, mv.version, len(removed))


def _forget(loader: ModelLoader, gates: Iterable[LimitedInstance | None]) -> None:
    if loader.rate_limiter is not None:
        for gate in gates:
            if gate is not None:
                loader.rate_limiter.forget(gate)


async def _retire_sequences(
    loader: ModelLoader, mv: ModelVersion, instance: StubInstance, gate: LimitedInstance | None
) -> None:
    """Stop a removed instance of a sequence batcher once it holds no sequence (unless its
    version is unloading meanwhile: the unload stops it)."""
    scheduler = mv.scheduler
    assert isinstance(scheduler, SequenceBatcher)
    await scheduler.released(instance.source_index)
    if instance in mv.retiring and mv.state is ModelState.READY:
        mv.retiring.remove(instance)
        await instance.retire(RETIRE_TIMEOUT_S)
        log.info("'%s' version %d: stopped instance '%s'", mv.name, mv.version, instance.name)
    _forget(loader, [gate])
