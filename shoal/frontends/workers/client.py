"""A frontend worker's client of the core: the core API over Unix sockets.

:class:`RemoteCore` implements :class:`~shoal.core.api.CoreAPI`, so the HTTP and gRPC frontends
run in a worker process unchanged. The API's synchronous calls (health, metadata, statistics,
shared-memory registration, settings) are blocking round trips on their own socket: they are
rare, and the core answers them at once from its event loop. Inference, streams and model
control are asynchronous calls multiplexed by id on a second socket that the worker's event loop
reads; a cancelled call (a client that went away) cancels the core's side too. Large tensors do
not cross those sockets: inputs are placed in the worker's arena (``arenas.py``) and outputs read
where the stub wrote them (``outputs.py``), with their fds on a third socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, cast

from shoal.core.api import CoreAPI
from shoal.core.backlog import StreamQueue
from shoal.core.packed import TRACED
from shoal.core.packed import frame as packed_frame
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
from shoal.frontends.workers import _plain as plain
from shoal.frontends.workers import _response_wire as response_wire
from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers.arenas import StagingArena
from shoal.frontends.workers.control_socket import CoreGone, recv_frame
from shoal.frontends.workers.direct import DirectDispatch, direct_fits
from shoal.frontends.workers.direct_stubs import monotonic_ns
from shoal.frontends.workers.methods import ASYNC_METHODS, DIRECT_METHODS, SYNC_METHODS
from shoal.frontends.workers.outputs import MappedOutputs
from shoal.frontends.workers.packing import PackedRefused, Prepared, Restage, Snapshots, prepare
from shoal.frontends.workers.streams import StreamItem, drop, remote_stream, stream_answer
from shoal.ipc.arena import Block

__all__ = ["ASYNC_METHODS", "DIRECT_METHODS", "SYNC_METHODS", "CoreGone", "RemoteCore"]

_Answer = tuple[list[Any], list[memoryview]]


class RemoteCore(CoreAPI):
    """The core API, answered by the core process."""

    def __init__(
        self,
        control: socket.socket,
        arena: StagingArena | None = None,
        outputs: MappedOutputs | None = None,
    ) -> None:
        control.setblocking(True)
        self._control = control
        #: Large input tensors are copied here and the core receives their blocks.
        self.arena = arena
        #: Large output tensors are read here, in the stubs' output arenas.
        self.outputs = outputs
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[_Answer]] = {}
        self._streams: dict[int, asyncio.Queue[StreamItem]] = {}
        self._outbox: wire.Outbox | None = None
        self._reader: wire.FrameReader | None = None
        #: Set when the core asks the worker to stop, or goes away.
        self.stopping = asyncio.Event()
        #: Called after each frame sent to the core (the loop's busy poll for the answer).
        self.on_sent: Callable[[], None] | None = None
        #: The seconds the core gives the worker to finish its responses when it stops.
        self.stop_grace = 0.0
        #: Applies the core's log settings in this process: sent at the start and on every
        #: change (made through any worker).
        self.on_log_settings: Callable[[dict[str, ParamValue]], None] | None = None
        #: Called when the link drops without the core having asked the worker to stop.
        self.on_core_lost: Callable[[], None] | None = None
        #: The snapshots of model summaries that requests are checked and packed with here.
        self.snapshots = Snapshots(self._packing_summary)
        #: Plain requests sent straight to the stubs (``direct.py``); None: off.
        self.direct: DirectDispatch | None = None
        #: The trace ids of calls answered traced (``wire.TRACED``), until their caller reads.
        self._traced: dict[int, int] = {}

    def enable_direct(self, worker: int, counters: int) -> None:
        """Send plain requests straight to the stubs, as worker number ``worker``, counting
        them in the statistics counters of segment ``counters`` (an fd)."""
        if self.outputs is not None and self.arena is not None:
            segments, arena = self.outputs.segments, self.arena
            self.direct = DirectDispatch(worker, self._sync, segments, self.send, arena, counters)

    async def connect(self, calls: socket.socket) -> None:
        """Start reading answers from the asynchronous socket."""
        loop = asyncio.get_running_loop()
        reader = self._reader = wire.FrameReader(self._dispatch, self._lost)
        await loop.connect_accepted_socket(lambda: reader, sock=calls)
        assert reader.transport is not None
        if self._outbox is None:  # else made already, for a frame answered before this
            self._outbox = wire.Outbox(reader.transport)

    def send(self, header: list[Any], payloads: list[memoryview | bytes] | None = None) -> None:
        self._send_frame(wire.frame(header, payloads or ()))

    def _send_frame(self, pieces: list[bytes | memoryview]) -> None:
        outbox = self._outbox
        if outbox is None and self._reader is not None and self._reader.transport is not None:
            outbox = self._outbox = wire.Outbox(self._reader.transport)  # before connect() ended
        if outbox is None or outbox.transport.is_closing():
            raise CoreGone()
        outbox.put(pieces, copy=False)  # views of the request's buffers, kept while queued
        if self.on_sent is not None:
            self.on_sent()

    async def close(self) -> None:
        if self.direct is not None:
            self.direct.close()
        if self._outbox is not None:
            self._outbox.transport.close()
        self._control.close()
        if self.outputs is not None:
            self.outputs.close()
        if self.arena is not None:
            self.arena.close()

    def _lost(self) -> None:
        if not self.stopping.is_set() and self.on_core_lost is not None:
            self.on_core_lost()
        self._fail_all(CoreGone())
        self.stopping.set()

    def _dispatch(self, header: list[Any], payloads: list[memoryview]) -> None:
        kind, call_id, *fields = header
        if kind == wire.FREE:
            if self.arena is not None:
                self.arena.free(fields[0])
            return
        if kind == wire.DROP:
            if self.outputs is not None:
                self.outputs.drop(fields[0], fields[1])
            return
        if kind == wire.STOP:
            self.stop_grace = float(fields[0]) if fields else 0.0
            self.stopping.set()
            return
        if kind == wire.LOG_SETTINGS:
            if self.on_log_settings is not None:
                self.on_log_settings(fields[0])
            if call_id:  # an update (not the settings at our start): answered once all apply
                self.send([wire.LOG_APPLIED, call_id])
            return
        if kind == wire.STALE:
            self._refused(call_id, fields[0], fields[1])
            return
        if kind == wire.TRACED:  # (its caller gone: no timestamps will come)
            self._traced[call_id] = fields[0]
            if call_id not in self._calls:
                self.frontend_trace(self._traced.pop(call_id), [])
            return
        if kind == wire.DIRECT_STUB_GONE:
            if self.direct is not None:
                self.direct.stub_died(fields[0], plain.error_from_wire(fields[1]))
            return
        if kind == wire.DIRECT_REVOKE:
            if self.direct is not None:
                self.direct.revoke(fields[0], fields[1])
            else:
                self.send([wire.DIRECT_RELEASED, 0, fields[0]])
            return
        future = self._calls.pop(call_id, None)
        if future is not None:
            if future.done():
                return
            if kind == wire.ERROR:
                future.set_exception(plain.error_from_wire(fields[0]))
            else:
                future.set_result((fields, payloads))
            return
        stream_answer(self, call_id, self._streams.get(call_id), kind, fields, payloads)

    def _refused(self, call_id: int, stale: bool, flat: list[int]) -> None:
        """The core did not take relayed call ``call_id``: its caller sends it again, or, gone
        meanwhile, the blocks it staged are freed here (they are still the worker's)."""
        future = self._calls.pop(call_id, None)
        if future is not None and not future.done():
            future.set_exception(PackedRefused(stale))
        elif flat and self.arena is not None:
            self.arena.free(flat)

    def _fail_all(self, error: BaseException) -> None:
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)
        self._calls.clear()
        for queue in self._streams.values():
            queue.put_nowait(error)

    # --- calls ----------------------------------------------------------------------------

    def _sync(self, method: str, *args: Any) -> Any:
        self._control.sendall(b"".join(wire.frame([method, list(args)])))
        (kind, value), _ = recv_frame(self._control)
        if kind == wire.ERROR:
            raise plain.error_from_wire(value)
        return value

    async def _async(
        self,
        method: str,
        fields: list[Any],
        payloads: list[memoryview | bytes],
        request: InferRequest | None = None,
    ) -> _Answer:
        call_id = next(self._ids)
        pieces = wire.frame([wire.CALL, call_id, method, fields], payloads)
        return await self._answered(call_id, pieces, request)

    async def _answered(
        self, call_id: int, pieces: list[bytes | memoryview], request: InferRequest | None = None
    ) -> _Answer:
        """Send call ``call_id``'s frame, await its answer (cancel it if the caller gives up);
        ``request``'s ``trace_id`` becomes its trace's where the core says it is traced."""
        future: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        try:
            self._send_frame(pieces)
            return await future
        except asyncio.CancelledError:
            if self._calls.pop(call_id, None) is not None:
                self._cancel(call_id)
            raise
        finally:
            if self._traced and request is not None:  # (wire.TRACED came before the answer)
                request.trace_id = self._traced.pop(call_id, request.trace_id)

    def _cancel(self, call_id: int) -> None:
        with contextlib.suppress(CoreGone):
            self.send([wire.CANCEL, call_id])

    # --- InferenceAPI ---------------------------------------------------------------------

    def is_live(self) -> bool:
        return bool(self._sync("is_live"))

    def is_ready(self) -> bool:
        return bool(self._sync("is_ready"))

    def server_metadata(self) -> ServerMetadata:
        return cast("ServerMetadata", _decoded(ServerMetadata, self._sync("server_metadata")))

    def model_ready(self, name: str, version: str = "") -> bool:
        return bool(self._sync("model_ready", name, version))

    async def model_ready_now(self, name: str, version: str = "") -> bool:
        (ready,), _ = await self._async("model_ready_now", [name, version], [])
        return bool(ready)

    async def model_decoupled(self, name: str, version: str = "") -> bool:
        (decoupled,), _ = await self._async("model_decoupled", [name, version], [])
        return bool(decoupled)

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        metadata = self._sync("model_metadata", name, version)
        return cast("ModelMetadata", _decoded(ModelMetadata, metadata))

    def model_config(self, name: str, version: str = "") -> JsonDict:
        return cast("JsonDict", self._sync("model_config", name, version))

    def _request_fields(
        self,
        request: InferRequest,
        payloads: list[memoryview | bytes],
        staged: list[Block | None] | None = None,
    ) -> list[Any]:
        place: wire.Place | None = None if self.arena is None else self.arena.place
        if staged:  # inputs a relay placed already go as placed inputs
            place = Restage(staged, place)
        return wire.request_to_wire(request, payloads, place)

    def _packing_summary(self, name: str, version: str) -> list[Any] | None:
        return cast("list[Any] | None", self._sync("packing_summary", name, version))

    def _prepare(self, request: InferRequest) -> Prepared | None:
        """``request`` checked, staged and packed for the relay; None: the core's own way."""
        snapshot = self.snapshots.get(request.model_name, request.model_version)
        if snapshot is None:
            return None
        return prepare(request, snapshot, None if self.arena is None else self.arena.stage)

    def _response(self, answer: list[Any], views: list[memoryview]) -> InferResponse:
        if (outputs := self.outputs) is None:
            return response_wire.response_from_wire(answer, views)
        return response_wire.response_from_wire(answer, views, outputs.view, self._release)

    def _release(self, lease: int) -> None:
        """A response read in place is written: the core may give its blocks back."""
        try:
            self.send([wire.RELEASE, 0, lease])
        except CoreGone:
            pass  # the core is gone, and its blocks with it

    def infer(self, request: InferRequest) -> Coroutine[Any, Any, InferResponse]:
        """Not a coroutine: a request sent directly returns :meth:`DirectDispatch.submit`'s."""
        started = monotonic_ns()
        prepared = self._prepare(request)
        direct = self.direct
        answer: Coroutine[Any, Any, InferResponse] | None = None
        if prepared is not None and prepared.packed and direct is not None and direct_fits(request):
            answer = direct.submit(request, prepared, started)  # one level of await less
        return self._infer(request, prepared) if answer is None else answer

    async def _infer(self, request: InferRequest, prepared: Prepared | None) -> InferResponse:
        """``request`` the core's way: packed where it can be (``core/packed.py``), or not.
        Its ``trace_id`` -1 asks the core for its trace's id, set here when it is traced."""
        if prepared is not None and prepared.packed and (packed := prepared.fields) is not None:
            call_id = next(self._ids)
            try:
                flags = TRACED if request.trace_id < 0 else 0
                frame = packed_frame(call_id, packed, prepared.head, flags)
                answer, views = await self._answered(call_id, frame, request)
                return self._response(answer, views)
            except PackedRefused as refused:  # again the core's way, with what is staged
                if refused.stale:
                    self.snapshots.drop(request.model_name, request.model_version)
        payloads: list[memoryview | bytes] = []
        fields = self._request_fields(request, payloads, prepared.staged if prepared else None)
        answer, views = await self._async("infer", fields, payloads, request)
        return self._response(answer, views)

    def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        return remote_stream(self, request)  # an async generator: mypyc cannot compile it

    def open_stream(self, request: InferRequest) -> tuple[int, asyncio.Queue[StreamItem]]:
        """Send a streaming call; its answers arrive on the queue returned (None: the end)."""
        payloads: list[memoryview | bytes] = []
        fields = self._request_fields(request, payloads)
        call_id = next(self._ids)
        queue: asyncio.Queue[StreamItem] = StreamQueue()
        self._streams[call_id] = queue
        try:
            self.send([wire.CALL, call_id, "infer_stream", fields], payloads)
        except BaseException:
            self._streams.pop(call_id, None)
            raise
        return call_id, queue

    def close_stream(self, call_id: int, ended: bool) -> None:
        """The stream's reader is done with it (what it left unread is let go); the core's side
        is cancelled unless it ended."""
        drop(self._streams.pop(call_id, None), self._response)
        if not ended:
            self._cancel(call_id)

    def response(self, answer: list[Any], views: list[memoryview]) -> InferResponse:
        return self._response(answer, views)

    # --- ExtensionAPI ---------------------------------------------------------------------

    def model_statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        return cast(
            "list[ModelStatistics]",
            _decoded(list[ModelStatistics], self._sync("model_statistics", name, version)),
        )

    def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        return cast(
            "list[RepositoryEntry]",
            _decoded(list[RepositoryEntry], self._sync("repository_index", ready_only)),
        )

    async def load_model(
        self,
        name: str,
        config_json: str | None = None,
        files: dict[str, bytes] | None = None,
    ) -> None:
        await self._async("load_model", [name, config_json, files], [])

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        await self._async("unload_model", [name, unload_dependents], [])

    def register_system_shm(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._sync("register_system_shm", name, key, offset, byte_size)

    def unregister_system_shm(self, name: str = "") -> None:
        self._sync("unregister_system_shm", name)

    def system_shm_status(self, name: str = "") -> list[SharedMemoryRegion]:
        return cast(
            "list[SharedMemoryRegion]",
            _decoded(list[SharedMemoryRegion], self._sync("system_shm_status", name)),
        )

    def register_cuda_shm(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        self._sync("register_cuda_shm", name, raw_handle, device_id, byte_size)

    def unregister_cuda_shm(self, name: str = "") -> None:
        self._sync("unregister_cuda_shm", name)

    def cuda_shm_status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        return cast(
            "list[CudaSharedMemoryRegion]",
            _decoded(list[CudaSharedMemoryRegion], self._sync("cuda_shm_status", name)),
        )

    def log_settings(self) -> dict[str, ParamValue]:
        return cast("dict[str, ParamValue]", self._sync("log_settings"))

    def update_log_settings(self, settings: dict[str, ParamValue]) -> dict[str, ParamValue]:
        updated: dict[str, ParamValue] = self._sync("update_log_settings", settings)
        if self.on_log_settings is not None:
            self.on_log_settings(updated)
        return updated

    def trace_settings(self, model: str = "") -> dict[str, TraceValue]:
        return cast("dict[str, TraceValue]", self._sync("trace_settings", model))

    def update_trace_settings(
        self, changes: dict[str, TraceChange], model: str = ""
    ) -> dict[str, TraceValue]:
        return cast("dict[str, TraceValue]", self._sync("update_trace_settings", changes, model))

    def frontend_trace(self, trace_id: int, timestamps: list[tuple[str, int]]) -> None:
        """Sent one way: nothing waits for the core to take them."""
        with contextlib.suppress(CoreGone):  # the core is gone, and the trace with it
            self.send([wire.TRACE_STAMPS, 0, trace_id, timestamps])


def _decoded(kind: Any, value: Any) -> Any:
    return plain.from_plain(kind, value)
