"""The API that every frontend calls: two Protocols the supervisor's service implements.

:class:`InferenceAPI` is what every server must answer (health, metadata, inference);
:class:`ExtensionAPI` holds Triton's protocol extensions (statistics, model repository, shared
memory, logging, trace settings). A core may raise ``NotImplementedError`` from an extension call:
frontends answer "not supported" (HTTP 501, gRPC UNIMPLEMENTED). Methods raise
:class:`~shoal.core.errors.ShoalError` subclasses for everything else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Protocol

from shoal.core.types import (
    CudaSharedMemoryRegion,
    InferRequest,
    InferResponse,
    JsonDict,
    ModelMetadata,
    ModelStatistics,
    ParamValue,
    RepositoryEntry,
    ServerMetadata,
    SharedMemoryRegion,
    TraceChange,
    TraceValue,
)
from shoal.ipc.arena import Block, Segment

__all__ = ["ArenaRegistry", "CoreAPI", "ExtensionAPI", "InferenceAPI", "PeerArena"]


class InferenceAPI(Protocol):
    """Health, metadata and inference: what every frontend needs of the core."""

    def is_live(self) -> bool:
        """True while the server process is up; Unavailable ("Server exiting") while it drains."""
        ...

    def is_ready(self) -> bool:
        """True when the server accepts inference (every model ready, unless not strict);
        Unavailable ("Server exiting") while it drains."""
        ...

    def server_metadata(self) -> ServerMetadata:
        """Name, version and supported protocol extensions."""
        ...

    def model_ready(self, name: str, version: str = "") -> bool:
        """Whether the model (version) can serve; False (not an error) for unknown models."""
        ...

    async def model_ready_now(self, name: str, version: str = "") -> bool:
        """``model_ready``, and for a model that defines ``is_ready()``, what it says in every
        instance (Triton's user-defined readiness: not ready when it raises, answers no bool,
        or takes over 5 s; a check still running is joined, not repeated)."""
        ...

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        """Metadata of a loaded model; NotFound / Unavailable otherwise."""
        ...

    async def model_decoupled(self, name: str, version: str = "") -> bool:
        """Whether the model version a request names is decoupled now (False for none).
        Asynchronous: a frontend worker asks the core without holding its event loop."""
        ...

    def model_config(self, name: str, version: str = "") -> JsonDict:
        """The model's configuration in Triton's JSON form."""
        ...

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run one inference request; the caller must ``release()`` the response."""
        ...

    def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """All responses of a request as they come: exactly one for a non-decoupled model, any
        number (possibly none) for a decoupled one. Each must be ``release()``d. Closing the
        iterator early drops the rest."""
        ...


class ExtensionAPI(Protocol):
    """Triton's protocol extensions. A call may raise ``NotImplementedError``: not supported."""

    def model_statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        """Statistics of one model (version), or of every model when ``name`` is empty."""
        ...

    def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        """Every model in the repositories with its state and reason."""
        ...

    async def load_model(
        self,
        name: str,
        config_json: str | None = None,
        files: dict[str, bytes] | None = None,
    ) -> None:
        """Load or reload a model (explicit model control); ``files`` keys are "file:<path>"."""
        ...

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Unload a model once its in-flight requests have finished."""
        ...

    def register_system_shm(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Register a client's POSIX shared-memory region (ALREADY_EXISTS if the name is taken)."""
        ...

    def unregister_system_shm(self, name: str = "") -> None:
        """Unregister one region, or all of them when ``name`` is empty."""
        ...

    def system_shm_status(self, name: str = "") -> list[SharedMemoryRegion]:
        """Registered regions (NOT_FOUND for an unknown ``name``)."""
        ...

    def register_cuda_shm(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        """Register a client's CUDA IPC handle (INVALID_ARG "GPUs not supported" without CUDA)."""
        ...

    def unregister_cuda_shm(self, name: str = "") -> None:
        """Unregister one CUDA region, or all of them when ``name`` is empty."""
        ...

    def cuda_shm_status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        """Registered CUDA regions (NOT_FOUND for an unknown ``name``)."""
        ...

    def log_settings(self) -> dict[str, ParamValue]:
        """Triton's logging settings (log_file, log_info, log_warning, log_error, log_verbose_level,
        log_format)."""
        ...

    def update_log_settings(self, settings: dict[str, ParamValue]) -> dict[str, ParamValue]:
        """Apply the given settings and return all of them."""
        ...

    def trace_settings(self, model: str = "") -> dict[str, TraceValue]:
        """Triton's trace settings for ``model`` ("" : the global ones): trace_file, trace_level
        (a list), trace_rate, trace_count, log_frequency, trace_mode."""
        ...

    def update_trace_settings(
        self, changes: dict[str, TraceChange], model: str = ""
    ) -> dict[str, TraceValue]:
        """Apply ``changes`` (None clears a model's setting) and return the settings in effect."""
        ...

    def frontend_trace(self, trace_id: int, timestamps: list[tuple[str, int]]) -> None:
        """A frontend's own timestamps (name, monotonic ns) of the traced request the core gave
        ``trace_id`` (:attr:`InferRequest.trace_id`), once it sent the response."""
        ...


class CoreAPI(InferenceAPI, ExtensionAPI, Protocol):
    """The whole API: what :class:`~shoal.supervisor.service.InferenceService` implements."""


class PeerArena(Protocol):
    """An arena another process owns (a frontend worker's input arena), as the core sees it:
    the core reads its blocks, hands its segments' fds to stubs and gives its blocks back."""

    @property
    def arena_id(self) -> int: ...

    def segment(self, index: int) -> Segment:
        """The core's mapping of one of its segments."""
        ...

    def segment_fd(self, index: int) -> tuple[int, int]:
        """(fd, size) of one of its segments, to hand to a stub."""
        ...

    def free(self, blocks: list[Block]) -> None:
        """The core is done with these blocks: the owner may reuse them."""
        ...


class ArenaRegistry(Protocol):
    """Where the core finds the arenas of other processes (what its segment directory does)."""

    def attach_arena(self, arena: PeerArena) -> None:
        """Blocks of ``arena`` may now appear in requests."""
        ...

    def detach_arena(self, arena_id: int) -> None:
        """The owner has gone and the core holds none of its blocks any more: every stub
        drops the arena's segments."""
        ...

    def segment_retired(self, arena_id: int, index: int) -> None:
        """The owner retired one segment: the stubs that mapped it drop it."""
        ...

    def segment_fd(self, arena_id: int, index: int) -> tuple[int, int]:
        """(fd, size) of any segment the core knows (a stub's output arena's, for a worker that
        writes a response from it)."""
        ...

    def watch_segments(self, owner: object, gone: Callable[[int, int], None]) -> None:
        """Call ``gone(arena, segment)`` when a segment goes away (``segment`` -1: the whole
        arena, e.g. a stub that exited), until ``unwatch_segments(owner)``."""
        ...

    def unwatch_segments(self, owner: object) -> None: ...
