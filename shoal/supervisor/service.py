"""The inference service: the implementation of :class:`~shoal.supervisor.core.CoreAPI`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import shoal
from shoal import config as model_config
from shoal.ipc.arena import Block, OwnedArena
from shoal.supervisor import staging
from shoal.supervisor.errors import ErrorCode, NotFound, ShoalError, Unavailable
from shoal.supervisor.models import ModelLoader, ModelState, ModelVersion
from shoal.supervisor.options import ServerOptions
from shoal.supervisor.repository import scan
from shoal.supervisor.types import (
    InferOutput,
    InferRequest,
    InferResponse,
    JsonDict,
    ModelMetadata,
    ServerMetadata,
    TensorMetadata,
)
from shoal.supervisor.work import Completion, Work

log = logging.getLogger("shoal")

EXTENSIONS = ("binary_tensor_data", "model_configuration", "parameters")
INPUT_ARENA_ID = 0


class InferenceService:
    """Owns the input arena and the loaded models; frontends call it through CoreAPI."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.models: dict[str, dict[int, ModelVersion]] = {}
        self.failed: dict[str, str] = {}
        arenas = options.arenas
        self.input_arena = OwnedArena(
            INPUT_ARENA_ID,
            initial_bytes=arenas.input_initial_bytes,
            growth_bytes=arenas.growth_bytes,
            limit_bytes=arenas.limit_bytes,
            on_new_segment=self._announce_segment,
        )
        self.loader = ModelLoader(self.input_arena, arenas, self._free_inputs)
        self._live = True

    # -- lifecycle --------------------------------------------------------------------------

    def _announce_segment(self, segment: Any) -> None:
        # Runs for the first segment too, from the arena's constructor, before any model exists.
        for versions in self.models.values():
            for mv in versions.values():
                for instance in mv.instances:
                    instance.announce_segment(segment)

    def _free_inputs(self, blocks: list[Block]) -> None:
        for block in blocks:
            self.input_arena.free(block)

    def _prepare(self, name: str, path: str) -> list[ModelVersion]:
        config = model_config.load_model_config(path, strict=self.options.strict_model_config)
        available = model_config.list_versions(path)
        chosen = model_config.select_versions(config.version_policy, available)
        if not chosen:
            raise model_config.ConfigError(
                f"model '{name}' has no version directory to load in '{path}' "
                "(expected numeric subdirectories such as '1/')"
            )
        as_json = model_config.config_to_json(config)
        return [ModelVersion(name, v, config, as_json) for v in chosen]

    async def load_repository(self) -> None:
        """Load every model found in the repositories; failures are recorded, not raised."""
        sources, broken = scan(self.options.model_repositories)
        self.failed.update(broken)
        pending: list[ModelVersion] = []
        for name, source in sources.items():
            try:
                versions = self._prepare(name, source.path)
            except Exception as error:  # a bad model must not stop the others
                self.failed[name] = str(error)
                log.error("failed to load model '%s': %s", name, error)
                continue
            self.models[name] = {mv.version: mv for mv in versions}
            pending.extend(versions)
        await asyncio.gather(*(self.loader.start(mv) for mv in pending))

    async def shutdown(self, timeout: float) -> None:
        """Stop every model (finalize, then signals) and free the input arena."""
        self._live = False
        versions = [mv for versions in self.models.values() for mv in versions.values()]
        await asyncio.gather(*(self.loader.stop(mv, timeout) for mv in versions))
        self.input_arena.close()

    # -- CoreAPI: health and metadata -------------------------------------------------------

    def is_live(self) -> bool:
        return self._live

    def is_ready(self) -> bool:
        if not self._live:
            return False
        if not self.options.strict_readiness:
            return True
        if self.failed:
            return False
        return all(mv.ready for versions in self.models.values() for mv in versions.values())

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata("shoal", shoal.__version__, EXTENSIONS)

    def _resolve(self, name: str, version: str) -> ModelVersion:
        versions = self.models.get(name)
        if versions is None:
            if name in self.failed:
                raise Unavailable(
                    f"Request for unknown model: '{name}' is not found: {self.failed[name]}",
                    ErrorCode.UNAVAILABLE,
                )
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        if version:
            try:
                mv = versions[int(version)]
            except (ValueError, KeyError):
                raise NotFound(
                    f"Request for unknown model: '{name}' version {version} is not found"
                ) from None
            if not mv.ready:
                raise Unavailable(
                    f"Request for unavailable model: '{name}' version {version} is not ready"
                    + (f": {mv.reason}" if mv.reason else "")
                )
            return mv
        ready = [mv for mv in versions.values() if mv.ready]
        if not ready:
            reasons = "; ".join(mv.reason for mv in versions.values() if mv.reason)
            raise Unavailable(
                f"Request for unknown model: '{name}' has no available versions"
                + (f": {reasons}" if reasons else "")
            )
        return max(ready, key=lambda mv: mv.version)

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            self._resolve(name, version)
        except ShoalError:
            return False
        return True

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        mv = self._resolve(name, version)
        config = mv.config
        batch = (-1,) if config.max_batch_size > 0 else ()
        versions = tuple(str(v) for v, m in sorted(self.models[name].items()) if m.ready)
        return ModelMetadata(
            name=name,
            versions=versions,
            platform=config.platform or config.backend,
            inputs=tuple(
                TensorMetadata(t.name, t.datatype, batch + tuple(t.dims)) for t in config.inputs
            ),
            outputs=tuple(
                TensorMetadata(t.name, t.datatype, batch + tuple(t.dims)) for t in config.outputs
            ),
        )

    def model_config(self, name: str, version: str = "") -> JsonDict:
        versions = self.models.get(name)
        if versions and not version:
            # The config is served even while the model is not ready, as Triton does.
            return max(versions.values(), key=lambda mv: mv.version).config_json
        return self._resolve(name, version).config_json

    # -- CoreAPI: inference -----------------------------------------------------------------

    async def infer(self, request: InferRequest) -> InferResponse:
        mv = self._resolve(request.model_name, request.model_version)
        staging.check_inputs(mv.config, request)
        outputs = staging.check_outputs(mv.config, request)
        record, blocks = staging.stage_request(mv.config, request, self.input_arena, outputs)
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        if mv.state is not ModelState.READY:
            self._free_inputs(blocks)
            raise Unavailable(f"model '{mv.name}' version {mv.version} is not ready")
        mv.submit(Work(record, blocks, future))
        completion = await future
        return self._response(mv, request, completion)

    def _response(
        self, mv: ModelVersion, request: InferRequest, completion: Completion
    ) -> InferResponse:
        record = completion.response
        if record.error is not None:
            code_name, message = record.error
            code = ErrorCode.__members__.get(code_name, ErrorCode.INTERNAL)
            raise ShoalError(message, code)
        outputs = [
            InferOutput(o.name, o.datatype, o.shape, completion.view(o.location))  # type: ignore[arg-type]
            for o in record.outputs
        ]
        blocks = list({o.location: None for o in record.outputs if isinstance(o.location, Block)})
        return InferResponse(
            model_name=mv.name,
            model_version=str(mv.version),
            id=request.id,
            outputs=outputs,
            parameters=dict(record.parameters),
            _release=lambda: completion.release(blocks),
        )
