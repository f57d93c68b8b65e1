"""The model repository manager: which model versions are loaded, loading and unloading them.

``--model-control-mode=none`` loads everything at start; ``explicit`` loads what ``--load-model``
names (``*`` for all) and then what clients ask for. A reload brings the new versions up before the
old ones are drained, so no request fails during it.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable, Iterator

from shoal import config as model_config
from shoal.core.errors import InvalidArgument, ShoalError, Unavailable
from shoal.core.types import RepositoryEntry
from shoal.supervisor.calls.control import ModelControl
from shoal.supervisor.models._step_models import settle_ensemble
from shoal.supervisor.models.index import repository_index
from shoal.supervisor.models.instance_update import update_in_place
from shoal.supervisor.models.loaded import LoadedModels
from shoal.supervisor.models.overrides import KeptOverrides
from shoal.supervisor.models.preparation import check_model_name, parse_override, prepare_versions
from shoal.supervisor.models.remote_repository import RemoteRepositoryError, RepositorySources
from shoal.supervisor.models.repository import Fingerprint, ModelSource, fingerprint, scan
from shoal.supervisor.models.uploads import write_model_files
from shoal.supervisor.models.version import ModelState, ModelVersion
from shoal.supervisor.models.versions import ModelLoader, without_repository
from shoal.supervisor.options import ServerOptions

log = logging.getLogger("shoal")


class _LoggedLoadFailure(InvalidArgument):
    """A version failed to start; the loader has logged why, with the model's traceback."""


class ModelRepositoryManager:
    """Loaded versions by model name, plus the reason of each model that failed to load."""

    def __init__(
        self,
        options: ServerOptions,
        loaded: LoadedModels,
        make_loader: Callable[[ModelControl], ModelLoader],
    ) -> None:
        """``make_loader`` builds the loader with this manager as the model control its stubs'
        ``pb_utils.load_model`` / ``unload_model`` calls reach (the one cycle in the wiring)."""
        self.options = options
        self.loaded = loaded
        self.loader = make_loader(self)
        # Local repositories as they are, remote ones mirrored: what scan() reads.
        self.sources = RepositorySources(options.model_repositories, options.model_repository_cache)
        # The registry's own dicts: the manager writes them, requests read them through it.
        self.models = loaded.models
        self.failed = loaded.failed
        self._locks: dict[str, asyncio.Lock] = {}
        self._scratch: dict[str, str] = {}  # model name -> temp dir holding uploaded files
        self._overrides = KeptOverrides()
        self._fingerprints: dict[str, Fingerprint] = {}
        self._poller: asyncio.Task[None] | None = None
        self._loading: set[str] = set()
        # Taken before any model's lock, never inside a load (one a model's initialize asks
        # for, an ensemble's steps): a load that holds a lock never waits for a slot.
        self._load_slots = asyncio.Semaphore(max(1, options.model_load_thread_count))
        # Models loaded only because an ensemble needed them (unload_dependents unloads them).
        self._composing: set[str] = set()
        # Ensembles unloaded because a step model was: loaded again when it is, as Triton does.
        self._orphans: set[str] = set()

    def versions(self) -> Iterator[ModelVersion]:
        return self.loaded.versions()

    # -- start-up ---------------------------------------------------------------------------

    async def load_startup(self) -> dict[str, str]:
        """Load what the control mode says to load at start; returns the models that failed,
        with the reason (each is logged once, and recorded for the repository index)."""
        await self.sources.open()
        sources, broken = scan(self.sources.local_paths)
        self._record_broken(broken)
        names = self._startup_names(sources)
        # Claimed before any starts, so an ensemble does not load its steps a second time.
        self._loading.update(names)
        results = await asyncio.gather(*(self._load_quietly(name) for name in names))
        if self.options.model_control_mode == "poll":
            self._start_polling(sources)
        failures = dict(broken)
        failures.update((n, r) for n, r in zip(names, results, strict=True) if r is not None)
        return failures

    def _record_broken(self, broken: dict[str, str]) -> None:
        """Models that cannot load as they lie (a name in two repositories): listed, logged."""
        self.failed.update(broken)
        for reason in broken.values():
            log.error("%s", reason)

    def _startup_names(self, sources: dict[str, ModelSource]) -> list[str]:
        """Every model in the repositories, or in explicit mode those ``--load-model`` names."""
        if self.options.model_control_mode != "explicit":
            return sorted(sources)
        wanted = set(self.options.load_models)
        return sorted(sources) if "*" in wanted else sorted(wanted)

    def _start_polling(self, sources: dict[str, ModelSource]) -> None:
        self._fingerprints = {n: fingerprint(s.path) for n, s in sources.items()}
        self._poller = asyncio.create_task(self._poll_forever(), name="repository poll")

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.repository_poll_secs)
            try:
                await self.poll_once()
            except RemoteRepositoryError as error:  # the store is unreachable: keep what runs
                log.error("repository poll failed: %s", error)
            except Exception:  # a bad poll must not stop polling
                log.exception("repository poll failed")

    async def poll_once(self) -> None:
        """Load added models, reload changed ones, unload removed ones."""
        await self.sources.sync()
        sources, _ = scan(self.sources.local_paths)
        current = {n: fingerprint(s.path) for n, s in sources.items()}
        changed, removed = self._changes(current)
        self._fingerprints = current
        for name in removed:
            await self._forget(name)
        await asyncio.gather(*(self._load_quietly(name) for name in changed))

    def _changes(self, current: dict[str, Fingerprint]) -> tuple[list[str], list[str]]:
        """The models added or changed since the last poll, and the models removed."""
        known = set(self.models) | set(self.failed) | set(self._fingerprints)
        changed = [n for n in current if current[n] != self._fingerprints.get(n)]
        return changed, [n for n in known if n not in current]

    async def _forget(self, name: str) -> None:
        log.info("model '%s' left the repository: unloading it", name)
        if name in self.models:
            await self._unload_locked(name)
        self.models.pop(name, None)
        self.failed.pop(name, None)
        self.loaded.removed.add(name)

    async def _load_quietly(self, name: str) -> str | None:
        """Load ``name`` (``--model-load-thread-count`` at once); why it failed, or None."""
        try:
            async with self._load_slots:
                await self.load(name, _startup=True)
        except _LoggedLoadFailure as error:
            return str(error)
        except Exception as error:  # one model's failure must not stop the others
            log.error("%s", error)
            return str(error)
        return None

    # -- load / unload ----------------------------------------------------------------------

    def _check_control_allowed(self) -> None:
        if self.options.model_control_mode != "explicit":
            # Triton's code and words whatever the mode (clients match them), then what to do.
            words = "explicit model load / unload is not allowed if polling is enabled"
            raise Unavailable(
                words
                if self.options.model_control_mode == "poll"
                else f"{words} (this server runs with --model-control-mode=none: start it "
                "with --model-control-mode=explicit)"
            )

    async def load(
        self,
        name: str,
        config_json: str | None = None,
        files: dict[str, bytes] | None = None,
        *,
        _startup: bool = False,
    ) -> None:
        if not _startup:
            self._check_control_allowed()
            self._composing.discard(name)  # asked for by name: no longer only a step model
        self._orphans.discard(name)
        self._loading.add(name)
        try:
            if not _startup and not files:
                await self._sync_model(name)
            await self._load_retrying(name, config_json, files)
        finally:
            self._loading.discard(name)
        await self._reload_orphans()

    async def _load_retrying(
        self, name: str, config_json: str | None, files: dict[str, bytes] | None
    ) -> None:
        """``--model-load-retry-count``: a model that failed to load is tried again (a model
        whose initialize waits on something still starting), the last failure is the answer."""
        retries = self.options.model_load_retry_count
        for attempt in range(retries + 1):
            try:
                await self._load_locked(name, config_json, files)
                return
            except Exception as error:
                if attempt == retries:
                    raise
                log.warning(
                    "retrying the load of '%s' (%d/%d): %s", name, attempt + 1, retries, error
                )

    async def _sync_model(self, name: str) -> None:
        """An explicit load reads the model as its remote repository has it now."""
        try:
            await self.sources.sync(name)
        except RemoteRepositoryError as error:
            raise InvalidArgument(f"failed to load '{name}': {error}") from None

    async def _load_locked(
        self, name: str, config_json: str | None, files: dict[str, bytes] | None
    ) -> None:
        async with self._locks.setdefault(name, asyncio.Lock()):
            new = await self._new_versions(name, config_json, files)
            kept = await update_in_place(self.loader, self.models.get(name, {}).values(), new)
            new = [mv for mv in new if all(mv.version != k.version for k in kept)]
            await asyncio.gather(*(self.loader.start(mv) for mv in new))
            await self._fail_unless_ready(name, new)
            await self._swap_in(name, new, kept)
            log.info("successfully loaded '%s'", name)  # Triton's line, once per load

    async def _new_versions(
        self, name: str, config_json: str | None, files: dict[str, bytes] | None
    ) -> list[ModelVersion]:
        """The versions ``name`` loads as, checked against the models they depend on."""
        path = self._model_path(name, config_json, files)
        config_json = self._overrides.resolve(name, path, config_json, bool(files))
        new = await self._prepare(name, path, parse_override(name, config_json))
        await self._load_composing(name, new)
        self._check_ensembles(name, new)
        return new

    async def _swap_in(self, name: str, new: list[ModelVersion], kept: list[ModelVersion]) -> None:
        """Serve ``new`` in place of the versions of ``name`` that served, then retire those
        not ``kept`` (updated in place). A version that is not among ``new`` (its directory
        left, or the policy dropped it) stays listed unloaded, as Triton keeps it."""
        old = self.models.get(name, {})
        table = dict(old)
        table.update((mv.version, mv) for mv in new)
        self.models[name] = table
        self.failed.pop(name, None)
        self._overrides.served(name)
        await asyncio.gather(*(self._retire(mv) for mv in old.values() if mv not in kept))

    async def _prepare(
        self, name: str, path: str, override: dict[str, object] | None
    ) -> list[ModelVersion]:
        try:
            return await prepare_versions(name, path, override, self.options)
        except model_config.ConfigError as error:
            log.error("failed to load '%s': %s", name, error)
            reason = without_repository(str(error), path)
            self._record_failure(name, reason, isinstance(error, model_config.NoVersionToServe))
            raise _LoggedLoadFailure(f"failed to load '{name}': {reason}") from None

    def _check_ensembles(self, name: str, new: list[ModelVersion]) -> None:
        for mv in new:
            problem = self._ensemble_problem(mv)
            if problem is not None:
                self._record_failure(name, problem)
                raise InvalidArgument(f"failed to load '{name}': {problem}")

    async def _fail_unless_ready(self, name: str, new: list[ModelVersion]) -> None:
        """A version failed to start: stop the others, and keep the new versions (with their
        reasons) only when no version of ``name`` serves."""
        broken = [mv for mv in new if not mv.ready]
        if not broken:
            return
        await asyncio.gather(*(self.loader.stop(mv, 5.0) for mv in new if mv.ready))
        # Each reason reads "failed to load '<name>' version <n>: ...".
        reason = "; ".join(mv.reason for mv in broken)
        if not self._ready(name):
            self.models[name] = {mv.version: mv for mv in new}
        # Triton's words first (clients match them), then which version failed and why.
        raise _LoggedLoadFailure(f"load failed for model '{name}': {reason}")

    def _record_failure(self, name: str, reason: str, versionless: bool = False) -> None:
        """``name`` failed to load. A failed reload keeps the version that serves, as Triton
        does: the model and the server stay ready (model-analyzer reloads configurations, some
        of which cannot load here, through a server it expects to stay ready)."""
        if not self._ready(name):
            self.loaded.fail(name, reason, versionless)

    async def _load_composing(self, name: str, versions: list[ModelVersion]) -> None:
        """An ensemble's step models are loaded with it (explicit mode), as Triton does."""
        steps = {s.model_name for mv in versions for s in mv.config.ensemble_steps}
        # An unloaded step model is still listed (with its reason) but must be loaded again.
        missing = [
            m for m in sorted(steps) if m != name and not self._ready(m) and m not in self._loading
        ]
        for model in missing:
            try:
                await self.load(model, _startup=True)
            except ShoalError as error:
                raise InvalidArgument(
                    f"failed to load '{name}': its step model '{model}' failed to load: {error}"
                ) from None
            self._composing.add(model)

    def _ensemble_problem(self, mv: ModelVersion) -> str | None:
        if not mv.config.is_ensemble:
            return None
        sources, _ = scan(self.sources.local_paths)
        return settle_ensemble(mv, sources, self.models, self.options.model_config_name)

    def _model_path(
        self, name: str, config_json: str | None, files: dict[str, bytes] | None
    ) -> str:
        check_model_name(name)
        if not files:
            return self._repository_path(name)
        if config_json is None:
            raise InvalidArgument(
                f"failed to load '{name}': model files were given without a 'config' "
                "parameter; Triton requires the config with file overrides"
            )
        return self._write_files(name, files)

    def _repository_path(self, name: str) -> str:
        sources, _ = scan(self.sources.local_paths)
        source = sources.get(name)
        if source is None:
            # Triton's two lines: why in the log, the summary to the client.
            log.error("failed to poll model '%s': model not found in any model repository.", name)
            raise InvalidArgument(f"failed to load '{name}', failed to poll from model repository")
        return source.path

    def _write_files(self, name: str, files: dict[str, bytes]) -> str:
        """Write uploaded files to a new scratch directory of ``name`` (gone at its unload)."""
        root, model_dir = write_model_files(name, files)
        self._remove_scratch(name)
        self._scratch[name] = root
        return model_dir

    def _remove_scratch(self, name: str) -> None:
        scratch = self._scratch.pop(name, None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    async def _retire(self, mv: ModelVersion) -> None:
        """Let a replaced or unloaded version finish what it has, then stop it."""
        mv.state = ModelState.UNLOADING
        try:
            await asyncio.wait_for(self.loader.drain(mv), self.options.exit_timeout_secs)
        except asyncio.TimeoutError:
            log.warning(
                "'%s' version %d did not drain in time; failing what is left", mv.name, mv.version
            )
        await self.loader.stop(mv, self.options.exit_timeout_secs)
        mv.reason = "unloaded"

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Unload ``name`` (a model that is not loaded is no error, as in Triton). Ensembles
        that use it are unloaded too, and loaded again when it is; ``unload_dependents``
        also unloads the step models an ensemble loaded for itself, unless another loaded
        ensemble uses them."""
        self._check_control_allowed()
        await self._unload_with_dependents(name, unload_dependents)

    async def _unload_with_dependents(self, name: str, unload_dependents: bool) -> None:
        steps = self._direct_steps(name) if unload_dependents else []
        self._composing.discard(name)
        self._orphans.discard(name)
        await self._unload_locked(name)
        await self._orphan_users_of(name)
        for step in steps:
            if step in self._composing and not self._users_of(step):
                await self._unload_with_dependents(step, True)

    def _users_of(self, name: str) -> list[str]:
        """The loaded ensembles with ``name`` as a step."""
        return [u for u in self.models if self._ready(u) and name in self._direct_steps(u)]

    async def _orphan_users_of(self, name: str) -> None:
        """Unload the loaded ensembles with ``name`` as a step, remembering them."""
        for user in self._users_of(name):
            log.info("unloading ensemble '%s': its step model '%s' was unloaded", user, name)
            await self._unload_locked(user)
            self._orphans.add(user)
            await self._orphan_users_of(user)

    async def _reload_orphans(self) -> None:
        """Load again the ensembles unloaded for a step model, once all their steps are back."""
        for user in sorted(self._orphans):
            if user in self._orphans and all(self._ready(s) for s in self._direct_steps(user)):
                self._orphans.discard(user)
                try:
                    await self.load(user, _startup=True)
                except ShoalError as error:
                    log.error("could not load ensemble '%s' again: %s", user, error)

    def _ready(self, name: str) -> bool:
        return any(mv.ready for mv in self.models.get(name, {}).values())

    def _direct_steps(self, name: str) -> list[str]:
        """The step models of the loaded ensemble ``name`` (none for another model)."""
        versions = self.models.get(name, {}).values()
        return sorted({s.model_name for mv in versions for s in mv.config.ensemble_steps})

    async def _unload_locked(self, name: str) -> None:
        async with self._locks.setdefault(name, asyncio.Lock()):
            versions = self.models.get(name)
            if versions is None:
                self.failed.pop(name, None)  # nothing loaded: as in Triton, not an error
                return
            await asyncio.gather(*(self._retire(mv) for mv in versions.values()))
            self._remove_scratch(name)
            self._overrides.forget(name)

    async def shutdown(self, timeout: float) -> None:
        if self._poller is not None:
            self._poller.cancel()
        await asyncio.gather(*(self.loader.stop(mv, timeout) for mv in self.versions()))
        for name in list(self._scratch):
            self._remove_scratch(name)
        self.sources.close()

    # -- queries ----------------------------------------------------------------------------

    def resolve(self, name: str, version: str) -> ModelVersion:
        """The version a request for ``name`` (``version`` "" = the policy's latest) goes to."""
        return self.loaded.resolve(name, version)

    def model_ready(self, name: str, version: str) -> bool:
        try:
            self.resolve(name, version)
        except ShoalError:
            return False
        return True

    def all_ready(self) -> bool:
        if self.failed:
            return False
        return all(mv.serving or mv.reason == "unloaded" for mv in self.versions())

    def index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        try:
            sources, _ = scan(self.sources.local_paths)
        except OSError as error:  # no descriptor left to list a directory with, for one
            log.warning(
                "repository index: cannot scan the repositories (%s): loaded models only", error
            )
            sources = {}
        return repository_index(sources, self.models, self.failed, ready_only)
