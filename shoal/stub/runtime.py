"""The stub's main loop: receive → execute → respond, until the supervisor says finalize."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import inspect
import json
import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from shoal.ipc import messages as msg
from shoal.ipc.arena import ArenaMap, Block, OwnedArena, Segment
from shoal.ipc.cuda import CudaPoolMap
from shoal.ipc.down_set import DownSet
from shoal.ipc.fdpass import readable_now, recv_fds, send_fds
from shoal.ipc.queue import Channel, PeerGone
from shoal.ipc.tensor import CudaLocation, InlineBytes, Location, RegionLocation, inline_budget
from shoal.stub import c_python_backend_utils, failures, loader, pb_utils, readiness
from shoal.stub.bls import BlsClient
from shoal.stub.control import ControlClient, StubMetrics
from shoal.stub.direct_rings import DirectRings
from shoal.stub.executor import BatchExecutor
from shoal.stub.gpu_tensors import GpuTensors
from shoal.stub.lent_outputs import OutputLender
from shoal.stub.memory import ClientRegions, Locations, SharedOutputArena
from shoal.stub.pump import DownPump
from shoal.stub.serve_loop import send_result, serve_executes
from shoal.stub.tensors_out import TensorWriter

_PR_SET_PDEATHSIG = 1
#: Below this size a private copy of an input costs less than mapping and unmapping it.
PRIVATE_MAPPING_MIN_BYTES = 64 << 10


def _ask_for_death_signal() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _pidfd(pid: int) -> int | None:
    """A pidfd of the supervisor (or of a frontend worker); None where the kernel (or valgrind)
    has no pidfd_open, or the process is gone: the channel's blocking waits then poll the
    parent pid instead."""
    try:
        return os.pidfd_open(pid)
    except OSError as error:
        if error.errno not in (errno.ENOSYS, errno.ESRCH):
            raise
        return None


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when the supervisor dies, even by SIGKILL."""
    _ask_for_death_signal()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    # A Ctrl-C in the server's terminal is for the supervisor, which stops stubs in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class StubRuntime:
    """One model instance: owns its output arena, maps the supervisor's input arena."""

    def __init__(self, instance: str, sock_fd: int, channel_fds: list[int], parent: int) -> None:
        self.instance = instance
        self.sock = socket.socket(fileno=sock_fd)
        self.sock.setblocking(True)
        self.channel = Channel.attach(channel_fds, peer_pidfd=_pidfd(parent))
        #: Frontend workers' rings (direct dispatch), read with the core's.
        self.direct = DirectRings(DownSet(self.channel))
        self.pump: DownPump | None = None
        self.inputs = ArenaMap()
        self.regions = ClientRegions()
        self.cuda_pools = CudaPoolMap()
        self.gpu: GpuTensors | None = None
        self._segments_lock = threading.Lock()
        self.outputs: OwnedArena | None = None
        self.model: Any = None
        self.loop = asyncio.new_event_loop()

    # -- segments ---------------------------------------------------------------------------

    def _announce_segment(self, segment: Segment) -> None:
        assert segment.fd is not None
        announce = msg.SegmentAnnounce(segment.arena_id, segment.index, segment.size)
        send_fds(self.sock, announce.encode(), [segment.fd])

    def _announce_retired(self, segment: Segment) -> None:
        try:
            self._send(msg.SegmentRetired(segment.arena_id, segment.index))
        except PeerGone:
            pass  # the supervisor is gone: nobody maps the segment any more

    def _receive_announcement(self) -> None:
        payload, fds = recv_fds(self.sock)
        announce = msg.decode_socket(payload)
        if isinstance(announce, msg.SegmentAnnounce):
            self.inputs.add_fd(announce.arena_id, announce.segment, fds[0], announce.size)
        elif isinstance(announce, msg.DirectChannelAnnounce):
            self.direct.fds[announce.key] = fds
        else:
            self.cuda_pools.add(announce)

    def attach_direct(self, origin: int, pid: int) -> None:
        """Serve worker ``origin``'s direct ring (its fds were sent before the message)."""
        with self._segments_lock:
            while origin not in self.direct.fds:
                self._receive_announcement()
            fds = self.direct.fds.pop(origin)
        self.direct.attach(origin, fds, _pidfd(pid))

    def wait_for_chunk(self, location: CudaLocation) -> None:
        """Read the socket until the IPC handle of ``location``'s pool chunk has come."""
        if self.cuda_pools.has(location):
            return
        with self._segments_lock:
            while not self.cuda_pools.has(location):
                self._receive_announcement()

    def retire_chunk(self, device: int, chunk: int) -> None:
        """The supervisor gave a CUDA pool chunk back: close our handle of it (reading first
        an announcement of it that may still wait in the socket)."""
        with self._segments_lock:
            while readable_now(self.sock):
                self._receive_announcement()
        self.cuda_pools.retire(device, chunk)

    def retire_input(self, arena_id: int, segment: int) -> None:
        """Another arena's owner retired a segment: drop our fd and mapping of it.

        Its announcement may still wait, unread, in the socket (fds in flight keep the memory
        alive too): the supervisor sent it before this message, so reading what is there
        now takes it out.
        """
        with self._segments_lock:
            while readable_now(self.sock):
                self._receive_announcement()
            self.inputs.retire(arena_id, segment)

    def input_view(self, location: Location) -> memoryview:
        """A view of an input, receiving its segment's fd first if it is new to us."""
        if isinstance(location, InlineBytes):  # carried in the Execute (read-only bytes)
            return memoryview(location.data)
        if isinstance(location, RegionLocation):
            return self.regions.view(location)
        assert isinstance(location, Block)
        block = location
        if self.outputs is not None and block.arena_id == self.outputs.arena_id:
            return self.outputs.view(block)  # our own output, handed back (BLS, ensembles)
        # Threads (BLS callers, decoupled senders) share the socket and the map: one at a
        # time receives announcements, and each re-checks after taking the lock.
        with self._segments_lock:
            while not self.inputs.has(block.arena_id, block.segment):
                self._receive_announcement()
            return self.inputs.view(block)

    def private_input_view(self, location: Location, view: memoryview) -> memoryview:
        """A writable view of ``view`` (of ``location``) whose writes no one else sees: a
        copy-on-write mapping, or a plain copy where that is cheaper (small tensors) or the
        segment has no fd (named segments). A client region's ``view`` is already a copy."""
        if isinstance(location, RegionLocation):
            return view
        if isinstance(location, InlineBytes):  # small: a copy
            return memoryview(bytearray(view))
        assert isinstance(location, Block)
        if view.nbytes >= PRIVATE_MAPPING_MIN_BYTES:
            mapped: memoryview | None
            if self.outputs is not None and location.arena_id == self.outputs.arena_id:
                mapped = self.outputs.private_view(location)
            else:
                with self._segments_lock:
                    mapped = self.inputs.private_view(location)
            if mapped is not None:
                return mapped
        return memoryview(bytearray(view))

    # -- lifecycle --------------------------------------------------------------------------

    def _send(self, message: msg.Message) -> None:
        if type(message) is msg.Result and (pump := self.pump) is not None:
            send_result(pump, self.direct, self.channel, message)
            return
        self.channel.send_up(msg.encode(message))

    def _log_sink(self, level: int, message: str, filename: str, line: int) -> None:
        try:
            self._send(msg.Log(level, message, filename, line))
        except PeerGone:
            pass

    def _create_outputs(self, init: msg.Initialize) -> OwnedArena:
        initial, growth, limit = init.output_arena
        self.outputs = OwnedArena(
            init.output_arena_id,
            initial_bytes=initial,
            growth_bytes=growth,
            limit_bytes=limit,
            on_new_segment=self._announce_segment,
            on_retired_segment=self._announce_retired,
        )
        return self.outputs

    def _initialize(self, init: msg.Initialize) -> None:
        loader.install_pb_utils()
        pb_utils._set_model_dir(os.path.dirname(init.model_file))
        pb_utils._set_log_sink(self._log_sink)
        self.model = loader.create_model(init.model_file, init.args, init.runtime_file)
        self._call_initialize(init.args)

    def _call_initialize(self, args: dict[str, str]) -> None:
        initialize = getattr(self.model, "initialize", None)
        if initialize is not None:
            self._run_to_end(initialize(dict(args)))

    def _run_to_end(self, result: Any) -> None:
        """An ``async def`` initialize or finalize returned a coroutine: run it to its end."""
        if inspect.isawaitable(result):
            self.loop.run_until_complete(result)

    def run(self) -> int:
        """Serve until finalize or until the supervisor goes away; returns the exit code."""
        try:
            first = self._receive_initialize()
            cancels: list[Callable[[list[int]], None]] = []  # filled once execute can run
            writer, pump = self._output_side(first, cancels)
            if not self._initialized(first):
                return 1
            executor, bls = self._execute_side(first, writer, pump, cancels)
            self._send_ready(executor)
            return self._serve(executor, pump, bls)
        except PeerGone:
            return 1
        finally:
            self._close()

    def _receive_initialize(self) -> msg.Initialize:
        first = msg.decode(self.channel.recv_down())
        if not isinstance(first, msg.Initialize):
            raise RuntimeError(f"expected Initialize, got {type(first).__name__}")
        return first

    def _send_ready(self, executor: BatchExecutor) -> None:
        concurrent = executor.concurrent and not executor.decoupled
        user_ready = readiness.defines_is_ready(self.model)
        self._send(msg.Ready(concurrent=concurrent, user_ready=user_ready))

    def _output_side(
        self, first: msg.Initialize, cancels: list[Callable[[list[int]], None]]
    ) -> tuple[TensorWriter, DownPump]:
        """The output arena and its writer, the down pump, model control and GPU tensors:
        what ``initialize`` may use already."""
        outputs = SharedOutputArena(self._create_outputs(first))
        c_python_backend_utils._set_free_memory(outputs.free_bytes)
        writer = TensorWriter(outputs, Locations(), regions=self.regions)
        writer.inline_budget = inline_budget(_max_batch_size(first.args))
        lender = writer.lender = OutputLender(outputs, writer.locations)
        pb_utils._set_output_lender(lender.lend)

        def cancel(keys: list[int]) -> None:
            for each in cancels:
                each(keys)

        release = self.direct.free = lambda blocks: outputs.free(lender.released(blocks))
        self.direct.arena_id = outputs.arena_id
        pump = self.pump = DownPump(
            self.direct.downs,
            release,
            cancel,
            self.retire_input,
            self.retire_chunk,
            self.attach_direct,
            self.direct.detach,
            self.direct.released,
        )
        self._control(first, writer, pump)
        return writer, pump

    def _control(self, first: msg.Initialize, writer: TensorWriter, pump: DownPump) -> None:
        """Model control and custom metrics work from initialize on; BLS from execute on."""
        control = ControlClient(pump, self._send)
        writer.gpu = self.gpu = GpuTensors(
            control,
            self.cuda_pools,
            self.wait_for_chunk,
            force_cpu_inputs=_force_cpu_inputs(first.args),
        )
        pb_utils._set_model_controller(control)
        pb_utils._set_metrics_backend(StubMetrics(control))

    def _initialized(self, first: msg.Initialize) -> bool:
        """Run the model's ``initialize``; when it fails, say why (Ready with the error)."""
        try:
            self._initialize(first)
        except BaseException as error:
            text = failures.summary(error)
            self._send(msg.Ready(error=text, traceback=failures.user_traceback(error)))
            return False
        return True

    def _execute_side(
        self,
        first: msg.Initialize,
        writer: TensorWriter,
        pump: DownPump,
        cancels: list[Callable[[list[int]], None]],
    ) -> tuple[BatchExecutor, BlsClient]:
        executor = BatchExecutor(
            self.instance,
            self.model,
            writer,
            self.input_view,
            self._send,
            _is_decoupled(first.args),
            self.private_input_view,
            concurrent_async=_async_concurrency(first.args) > 1,
        )
        bls = BlsClient(writer, pump, self._send, self.input_view)
        cancels.append(executor.cancel)
        cancels.append(bls.cancel_requests)  # after the flags: the model sees them first
        pb_utils._set_bls_executor(bls)
        pb_utils._set_cancel_poller(pump.poll)
        return executor, bls

    def _serve(self, executor: BatchExecutor, pump: DownPump, bls: BlsClient) -> int:
        while True:
            message = serve_executes(pump, self.direct, executor, bls, self.channel)
            match message:
                case msg.ReadinessCheck():
                    readiness.start_check(self.model, executor.await_result, self._send)
                case msg.CudaRegionClosed(device=device, handle=handle):
                    self._forget_cuda_region(device, handle)
                case msg.RegionClosed(region=region):
                    self.regions.forget(region)
                case msg.Finalize():
                    self._finish()
                    return 0
                case _:
                    raise RuntimeError(f"unexpected message {type(message).__name__}")

    def _forget_cuda_region(self, device: int, handle: bytes) -> None:
        # Here, between batches: a sync execute is never reading it now.
        if self.gpu is not None:
            self.gpu.regions.forget(device, handle)

    def _finish(self) -> None:
        """Finalize: no more BLS, cancellation or control calls; then the model's finalize."""
        pb_utils._set_bls_executor(None)
        pb_utils._set_cancel_poller(None)
        pb_utils._set_model_controller(None)
        self._send(msg.Finalized(error=self._finalize()))

    def _finalize(self) -> str | None:
        finalize = getattr(self.model, "finalize", None)
        if finalize is None:
            return None
        try:
            self._run_to_end(finalize())
        except BaseException:
            return _format_exception()
        return None

    def _close(self) -> None:
        self.direct.close()
        self._close_gpu()
        pb_utils._set_log_sink(None)
        self.regions.close()
        sys.stdout.flush()
        sys.stderr.flush()

    def _close_gpu(self) -> None:
        try:
            if self.gpu is not None:
                self.gpu.close()  # the pool chunks and clients' regions it opened, if any
        except Exception:
            pass  # the driver drops them with the process anyway


def _force_cpu_inputs(args: dict[str, str]) -> bool:
    """FORCE_CPU_ONLY_INPUT_TENSORS (Triton's default "yes"; the supervisor checked the value
    when the model loaded)."""
    try:
        config = json.loads(args.get("model_config", "{}"))
        value = config.get("parameters", {}).get("FORCE_CPU_ONLY_INPUT_TENSORS", {})
        return str(value.get("string_value", "yes")).strip().lower() != "no"
    except (ValueError, AttributeError):
        return True


def _async_concurrency(args: dict[str, str]) -> int:
    """The model parameter ``async_execute_concurrency`` (1 when absent or not a number: the
    supervisor warns about such a value)."""
    try:
        config = json.loads(args.get("model_config", "{}"))
        value = config.get("parameters", {}).get("async_execute_concurrency", {})
        return int(str(value.get("string_value", "1")).strip() or "1")
    except (ValueError, AttributeError):
        return 1


def _max_batch_size(args: dict[str, str]) -> int:
    """The model's ``max_batch_size`` (0 when the configuration does not say)."""
    try:
        config = json.loads(args.get("model_config", "{}"))
        return max(0, int(config.get("max_batch_size", 0)))
    except (ValueError, TypeError, AttributeError):
        return 0


def _is_decoupled(args: dict[str, str]) -> bool:
    try:
        config = json.loads(args.get("model_config", "{}"))
        return bool(config.get("model_transaction_policy", {}).get("decoupled", False))
    except (ValueError, AttributeError):
        return False


def _format_exception() -> str:
    return traceback.format_exc().rstrip()
