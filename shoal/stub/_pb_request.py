"""``InferenceRequest`` (received by ``execute`` or built for BLS), ``PreferredMemory``, traces."""

from __future__ import annotations

import enum
import json
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from shoal.stub._pb_errors import TritonModelException
from shoal.stub._pb_request_checks import (
    MISSING,
    check_correlation_id,
    check_inputs,
    check_int,
    check_output_names,
    check_str,
    instance_of,
    required,
)
from shoal.stub._pb_response import (
    Deliver,
    InferenceResponse,
    InferenceResponseSender,
    ResponseIterator,
    check_parameters,
)
from shoal.stub._pb_tensor import Tensor
from shoal.stub.open_requests import CALLING, CancelFlag, set_cancel_poller

TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class MemoryType(enum.IntEnum):
    """pb_utils memory types (note: not Triton's ``TRITONSERVER_MemoryType`` numbering)."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1
    DEFAULT = 2


class PreferredMemory:
    """Where a BLS call should put its outputs: ``PreferredMemory(TRITONSERVER_MEMORY_GPU, 0)``."""

    __slots__ = ("_device_id", "_memory_type")

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        if isinstance(preferred_memory_type, bool) or preferred_memory_type not in (0, 1):
            raise TypeError(
                "preferred_memory_type must be pb_utils.TRITONSERVER_MEMORY_GPU or "
                f"pb_utils.TRITONSERVER_MEMORY_CPU, not {preferred_memory_type!r}"
            )
        if isinstance(preferred_device_id, bool) or not isinstance(preferred_device_id, int):
            raise TypeError(f"preferred_device_id must be an int, not {preferred_device_id!r}")
        self._memory_type = MemoryType(preferred_memory_type)
        self._device_id = preferred_device_id

    @classmethod
    def _default(cls) -> PreferredMemory:
        memory = cls.__new__(cls)
        memory._memory_type = MemoryType.DEFAULT
        memory._device_id = 0
        return memory

    def _type(self) -> MemoryType:
        """The memory type (``MemoryType.DEFAULT`` when the model expressed no preference)."""
        return self._memory_type

    def _device(self) -> int:
        return self._device_id


class InferenceTrace:
    """The trace context of a request (``request.trace()``); pass it on to BLS requests."""

    __slots__ = ("_context",)

    def __init__(self, context: str | None = None) -> None:
        self._context = context

    def get_context(self) -> str | None:
        """The trace context as a string, or ``None`` when the request is not traced."""
        return self._context


class BlsExecutor(Protocol):
    """What the runtime installs with ``_set_bls_executor`` while ``execute`` may call BLS."""

    def exec(
        self, request: InferenceRequest, decoupled: bool
    ) -> InferenceResponse | ResponseIterator: ...

    def async_exec(
        self, request: InferenceRequest, decoupled: bool
    ) -> Awaitable[InferenceResponse | ResponseIterator]: ...


#: What a request holds until the model sets its own: no preferred memory, no trace.
_NO_PREFERENCE = PreferredMemory._default()
_UNTRACED = InferenceTrace()

#: Bound once: ``cls.__new__`` is an attribute look-up on the class per call.
_new = object.__new__

_bls_executor: BlsExecutor | None = None
#: Held while a request's sender is made, or marked returned before it is (rarely contended:
#: the model's threads and the main loop, once per request at most).
_SENDER_MADE = threading.Lock()


def _set_bls_executor(executor: BlsExecutor | None) -> None:
    """Install (or with ``None`` remove) the object ``exec``/``async_exec`` delegate to."""
    global _bls_executor
    _bls_executor = executor


def _executor() -> BlsExecutor:
    executor = _bls_executor
    if executor is None:
        raise TritonModelException("BLS is only supported during the 'execute' function.")
    return executor


def _set_cancel_poller(poller: Callable[[], None] | None) -> None:
    """Install what ``is_cancelled()`` calls first: it takes in cancellations that arrived while
    the model was busy (as Triton's ``is_cancelled`` asks the server each time)."""
    set_cancel_poller(poller)


class InferenceRequest:
    """A request: received by ``execute``, or built by the model for a BLS call.

    The BLS constructor takes Triton's arguments: ``request_id``, ``correlation_id``, ``inputs``,
    ``requested_output_names``, ``model_name``, ``model_version``, ``flags``, ``timeout`` (µs),
    ``preferred_memory``, ``trace`` and ``parameters`` (``str`` keys, bool/int/str values).
    """

    # What a received request holds until the model or the runtime sets its own, read from the
    # class: ``_from_server`` writes only the fields of each request (a store costs, and so
    # does freeing it). ``_init`` writes them all.
    _parameters_json: str | None = None
    _target_name = ""
    _target_version = -1
    _memory = _NO_PREFERENCE
    _trace = _UNTRACED
    _release = TRITONSERVER_REQUEST_RELEASE_ALL
    _sender: InferenceResponseSender | None = None
    _returned = False

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Sequence[Tensor] = MISSING,
        requested_output_names: Sequence[str] = MISSING,
        model_name: str = MISSING,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, bool | int | str] | None = None,
    ) -> None:
        # A model that makes BLS calls: from now on the executor puts each batch's requests in
        # the context too, so that tasks and threads that copy it keep them (open_requests).
        CALLING.exact = True
        inputs = required(inputs, "inputs")
        requested_output_names = required(requested_output_names, "requested_output_names")
        model_name = required(model_name, "model_name")
        check_str(request_id, "request_id")
        check_str(model_name, "model_name")
        self._init(
            request_id=request_id,
            correlation_id=check_correlation_id(correlation_id),
            inputs=check_inputs(inputs, request_id, model_name),
            requested_output_names=check_output_names(
                requested_output_names, request_id, model_name
            ),
            flags=check_int(flags, "flags"),
            parameters=check_parameters(parameters),
            timeout=check_int(timeout, "timeout"),
            model_name=model_name,
            model_version=check_int(model_version, "model_version"),
            deliver=None,
            decoupled=False,
        )
        self._set_options(preferred_memory, trace)

    def _set_options(
        self, preferred_memory: PreferredMemory | None, trace: InferenceTrace | None
    ) -> None:
        if preferred_memory is not None:
            message = "preferred_memory must be a pb_utils.PreferredMemory"
            self._memory = instance_of(preferred_memory, PreferredMemory, message)
        if trace is not None:
            message = "trace must be an InferenceTrace (from request.trace())"
            self._trace = instance_of(trace, InferenceTrace, message)

    def _init(  # keep in step with ``_from_server``, which writes the same fields out
        self,
        request_id: str,
        correlation_id: int | str,
        inputs: list[Tensor],
        requested_output_names: list[str],
        flags: int,
        parameters: dict[str, Any],
        timeout: int,
        model_name: str,
        model_version: int,
        deliver: Deliver | None,
        decoupled: bool,
    ) -> None:
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = inputs
        self._requested_output_names = requested_output_names
        self._flags = flags
        self._parameters = parameters
        self._parameters_json: str | None = None
        self._timeout = timeout
        self._target_name = model_name
        self._target_version = model_version
        # Shared: neither has a setter, and one per request would cost two objects each.
        self._memory = _NO_PREFERENCE
        self._trace = _UNTRACED
        self._release = TRITONSERVER_REQUEST_RELEASE_ALL
        # Shared with the sender without a reference back to the request: no cycle keeps the
        # request (and its zero-copy input views) alive past its last use.
        self._cancellation = CancelFlag()
        # The sender is made when first asked for (``_response_sender``): most models never
        # take it, and one per request served costs a lock and two objects.
        self._deliver = deliver
        self._decoupled = decoupled
        self._sender: InferenceResponseSender | None = None
        self._returned = False

    @classmethod
    def _from_server(
        cls,
        request_id: str,
        correlation_id: int | str,
        inputs: list[Tensor],
        requested_output_names: list[str],
        flags: int,
        parameters: dict[str, Any],
        timeout: int,
        model_name: str,
        model_version: int,
        deliver: Callable[[InferenceResponse | None, int], None] | None,
        decoupled: bool,
        trace_context: str | None = None,
        cancellation: CancelFlag | None = None,
    ) -> InferenceRequest:
        """A request received from the server, for ``execute`` (no copies, no validation).

        ``deliver(response, flags)`` receives what ``InferenceResponseSender.send`` accepted;
        with ``deliver=None`` the request's sender raises on ``send`` like a BLS request's.
        ``cancellation`` is the flag the runtime sets when the client goes away (a new one
        when not given).
        """
        # ``_init`` written out, and only the fields that differ from the class's defaults
        # (``model_name`` "" and ``model_version`` -1 are the served model's): one call of a
        # Python function with eleven arguments costs more than these stores, and this runs
        # once per request served.
        request = _new(cls)
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._inputs = inputs
        request._requested_output_names = requested_output_names
        request._flags = flags
        request._parameters = parameters
        request._timeout = timeout
        if model_name:
            request._target_name = model_name
        if model_version != -1:
            request._target_version = model_version
        if trace_context is not None:
            request._trace = InferenceTrace(trace_context)
        # Shared with the sender without a reference back to the request: no cycle keeps the
        # request (and its zero-copy input views) alive past its last use.
        request._cancellation = CancelFlag() if cancellation is None else cancellation
        request._deliver = deliver
        request._decoupled = decoupled
        return request

    # -- public API ----------------------------------------------------------------------------

    def inputs(self) -> list[Tensor]:
        """The input tensors."""
        return list(self._inputs)

    def request_id(self) -> str:
        """The request id (``""`` when the client set none)."""
        return self._request_id

    def correlation_id(self) -> int | str:
        """The sequence correlation id (``0`` when none)."""
        return self._correlation_id

    def flags(self) -> int:
        """The request flags (``TRITONSERVER_REQUEST_FLAG_SEQUENCE_START``/``_END``)."""
        return self._flags

    def set_flags(self, flags: int) -> None:
        """Set the request flags (for BLS requests to stateful models)."""
        self._flags = check_int(flags, "flags")

    def timeout(self) -> int:
        """The timeout in microseconds (0: none)."""
        return self._timeout

    def parameters(self) -> str:
        """The request parameters as a JSON string; read them with ``json.loads``."""
        if self._parameters_json is None:
            self._parameters_json = json.dumps(self._parameters)
        return self._parameters_json

    def trace(self) -> InferenceTrace:
        """The request's trace (pass it to BLS requests to link the traces)."""
        return self._trace

    def requested_output_names(self) -> set[str]:
        """The names of the outputs the client asked for, as a set."""
        return set(self._requested_output_names)

    def get_response_sender(self) -> InferenceResponseSender:
        """The request's response sender (the same object on every call)."""
        sender = self._response_sender()
        sender._taken = True
        return sender

    def _response_sender(self) -> InferenceResponseSender:
        """The sender, made on first use (from any thread: under a lock, so there is one)."""
        sender = self._sender
        if sender is not None:
            return sender
        with _SENDER_MADE:
            sender = self._sender
            if sender is None:
                sender = InferenceResponseSender(
                    self._deliver, self._decoupled, self._cancellation.is_set
                )
                if self._returned:  # execute returned this request's response already
                    sender._mark_returned_unsent()
                self._sender = sender
            return sender

    def _awaits_sender(self) -> bool:
        """Whether the model took the response sender and has not sent FINAL through it yet
        (for the runtime: a default-mode response may still come from another thread)."""
        sender = self._sender
        return sender is not None and sender._is_taken() and not sender._is_closed()

    def _mark_returned(self, response: InferenceResponse) -> None:
        """``execute`` returned ``response`` for this request: as ``send(response, FINAL)``
        through its sender, unsent (raises ``TritonModelException`` as that send would). With
        no sender made yet nothing went through one: a sender made later starts closed."""
        if self._sender is None:
            # acquire and release, not ``with``: ~1k instructions less, once per response.
            _SENDER_MADE.acquire()
            try:
                if self._sender is None:
                    self._returned = True
                    return
            finally:
                _SENDER_MADE.release()
        self._response_sender()._mark_returned(response)

    def is_cancelled(self) -> bool:
        """Whether the client cancelled the request."""
        return self._cancellation.is_set()

    def set_release_flags(self, flags: int) -> None:
        """``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` to reschedule the request, or ``_ALL``."""
        flags = check_int(flags, "flags")
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(
                "Release flags must be TRITONSERVER_REQUEST_RELEASE_ALL or "
                f"TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, got {flags}"
            )
        self._release = flags

    def exec(self, decoupled: bool = False) -> InferenceResponse | ResponseIterator:
        """Run this request on another model (BLS) and wait for its response."""
        return _executor().exec(self, bool(decoupled))

    def async_exec(
        self, decoupled: bool = False
    ) -> Awaitable[InferenceResponse | ResponseIterator]:
        """Like ``exec``, as an awaitable, for ``async def execute``."""
        return _executor().async_exec(self, bool(decoupled))

    # -- hooks for the stub runtime ------------------------------------------------------------

    def _model_name(self) -> str:
        """The target model of a BLS request (the served model for a received one)."""
        return self._target_name

    def _model_version(self) -> int:
        return self._target_version

    def _preferred_memory(self) -> PreferredMemory:
        return self._memory

    def _parameters_dict(self) -> dict[str, Any]:
        return self._parameters

    def _release_flags(self) -> int:
        """What the model set with ``set_release_flags`` (``RELEASE_ALL`` by default)."""
        return self._release

    def _mark_cancelled(self) -> None:
        """Record that the client cancelled the request (``is_cancelled()`` turns true)."""
        self._cancellation.cancelled = True

    def __repr__(self) -> str:
        return (
            f"InferenceRequest(request_id={self._request_id!r}, model_name={self._target_name!r}, "
            f"inputs={self._inputs!r})"
        )
