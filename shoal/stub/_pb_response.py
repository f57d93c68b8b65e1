"""``InferenceResponse``, ``InferenceResponseSender`` and ``ResponseIterator``."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from shoal.stub._pb_errors import TritonError, TritonModelException
from shoal.stub._pb_tensor import Tensor

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

#: ``deliver(response, flags)``: the runtime's side of ``InferenceResponseSender.send``.
Deliver = Callable[["InferenceResponse | None", int], None]


def check_parameters(parameters: object) -> dict[str, bool | int | str]:
    """Validate request/response parameters set by a model: ``str`` keys, bool/int/str values."""
    if parameters is None:
        return {}
    if not isinstance(parameters, Mapping):  # Triton's exception and words
        raise TritonModelException(f"Expect parameters to be a dict, got {type(parameters)}")
    checked: dict[str, bool | int | str] = {}
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(value, bool | int | str):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
        checked[key] = value
    return checked


def _check_output(tensor: object) -> None:
    if tensor is None:
        raise TritonModelException("Output tensor in the inference response is None.")
    if not isinstance(tensor, Tensor):
        raise TypeError(
            f"output_tensors must hold pb_utils.Tensor objects, not {type(tensor).__name__}"
        )


#: The parameters of every response built without any: one dict, never written (the runtime
#: reads it; ``check_parameters`` builds a new dict for any given): a dict made and freed per
#: response costs ~200 instructions.
_NO_PARAMETERS: dict[str, Any] = {}


class InferenceResponse:
    """The response to one request: output tensors, or an error.

    ``InferenceResponse(output_tensors=[], error=None, parameters=None)``. When ``error`` is set
    the tensors are not sent. Outputs the client did not request are dropped when the response is
    sent. Do not reuse one response object for several requests.
    """

    __slots__ = ("_error", "_outputs", "_parameters", "_parameters_json")

    def __init__(
        self,
        output_tensors: Sequence[Tensor] = (),
        error: TritonError | None = None,
        parameters: Mapping[str, bool | int | str] | None = None,
    ) -> None:
        if output_tensors is None:
            raise TypeError("output_tensors must be a list of pb_utils.Tensor, not None")
        outputs = list(output_tensors)
        for tensor in outputs:
            if type(tensor) is not Tensor:  # the usual case in one test, the others below
                _check_output(tensor)
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"error must be a pb_utils.TritonError, not {type(error).__name__}")
        self._outputs = outputs
        self._error = error
        self._parameters: dict[str, Any] = (
            _NO_PARAMETERS if parameters is None else check_parameters(parameters)
        )
        # ``_parameters_json`` stays unset until ``parameters()`` is asked (most never are).

    @classmethod
    def _from_parts(
        cls, outputs: list[Tensor], error: TritonError | None, parameters: dict[str, Any]
    ) -> InferenceResponse:
        """A response built by the runtime (BLS results), whose parameters may hold doubles."""
        response = cls.__new__(cls)
        response._outputs = outputs
        response._error = error
        response._parameters = parameters
        return response

    def output_tensors(self) -> list[Tensor]:
        """The output tensors."""
        return list(self._outputs)

    def has_error(self) -> bool:
        """Whether this response carries an error."""
        return self._error is not None

    def error(self) -> TritonError | None:
        """The error, or ``None``."""
        return self._error

    def parameters(self) -> str:
        """The response parameters as a JSON string (``"{}"`` when there are none)."""
        text: str | None = getattr(self, "_parameters_json", None)
        if text is None:
            text = self._parameters_json = json.dumps(self._parameters)
        return text

    def _parameters_dict(self) -> dict[str, Any]:
        """The response parameters (for the runtime)."""
        return self._parameters

    def _error_code_name(self) -> str | None:
        """The error's code as a name ("INVALID_ARG", ...), or ``None`` without an error."""
        return None if self._error is None else self._error.code().name

    def __repr__(self) -> str:
        if self._error is not None:
            return f"InferenceResponse(error={self._error!r})"
        return f"InferenceResponse(output_tensors={self._outputs!r})"


_CLOSED = "Unable to send response. Response sender has been closed."


class InferenceResponseSender:
    """Sends the responses of one request (``request.get_response_sender()``).

    Decoupled models send zero or more responses and finish with
    ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; default-mode models send exactly one response and
    FINAL, together or one after the other. ``send`` returns once the runtime has taken the
    response. A sender may be used from other threads and after ``execute`` returns.
    """

    __slots__ = ("_closed", "_decoupled", "_deliver", "_is_cancelled", "_lock", "_sent", "_taken")

    def __init__(
        self, deliver: Deliver | None, decoupled: bool, is_cancelled: Callable[[], bool]
    ) -> None:
        """Built by ``InferenceRequest``; models get senders from ``get_response_sender()``."""
        self._deliver = deliver
        self._decoupled = decoupled
        self._is_cancelled = is_cancelled
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0
        self._taken = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Send ``response`` and/or ``flags`` (0 or ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``)."""
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError(
                f"response must be a pb_utils.InferenceResponse, not {type(response).__name__}"
            )
        if isinstance(flags, bool) or not isinstance(flags, int):
            raise TypeError(f"flags must be an int, not {type(flags).__name__}")
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        deliver = self._deliver
        if deliver is None:
            raise TritonModelException(
                "Unable to send response. Response sender has no reference to the decoupled "
                "state of the model."
            )
        with self._lock:  # held while delivering, so responses reach the runtime in send order
            self._advance(response, flags)
            deliver(response, flags)

    def is_cancelled(self) -> bool:
        """Whether the client cancelled the request."""
        return self._is_cancelled()

    def _advance(self, response: InferenceResponse | None, flags: int) -> None:
        if not self._decoupled:
            if response is not None and self._sent > 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one "
                    "response."
                )
            if (
                response is None
                and flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
                and not self._sent
            ):
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final "
                    "before sending a response."
                )
        if self._closed:
            raise TritonModelException(_CLOSED)
        if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._closed = True
        if response is not None:
            self._sent += 1

    # -- hooks for the stub runtime ------------------------------------------------------------

    def _mark_returned(self, response: InferenceResponse) -> None:
        """Count a response returned from ``execute`` as ``send(response, FINAL)``, unsent.

        Raises ``TritonModelException`` with the ``send`` message when that send would be misuse
        (a response or FINAL was already sent through the sender).
        """
        with self._lock:
            if not (self._sent or self._closed):  # the usual case: nothing sent through it
                self._closed = True
                self._sent = 1
                return
            self._advance(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _mark_returned_unsent(self) -> None:
        """A sender made after ``execute`` returned its request's response: closed, with that
        response counted (what ``_mark_returned`` makes of a fresh sender)."""
        self._closed = True
        self._sent = 1

    def _close(self) -> None:
        """Close the sender (``execute`` raised): later sends raise "...has been closed."."""
        with self._lock:
            self._closed = True

    def _is_closed(self) -> bool:
        """Whether FINAL was sent (or the sender was closed)."""
        return self._closed

    def _is_taken(self) -> bool:
        """Whether the model asked for this sender (``get_response_sender()``)."""
        return self._taken


class ResponseIterator:
    """The responses of a decoupled BLS call (``request.exec(decoupled=True)``).

    Iteration ends after the response that carried FINAL (which may have no tensors); iterating
    again afterwards replays the responses. Filled by the runtime through ``_push``.
    """

    def __init__(self, cancel: Callable[[], None] | None = None) -> None:
        """Built by the runtime's BLS executor."""
        self._cancel = cancel
        self._pending: queue.SimpleQueue[tuple[InferenceResponse, bool]] = queue.SimpleQueue()
        self._responses: list[InferenceResponse] = []
        self._next = 0
        self._finished = False
        self._first = threading.Event()

    def __iter__(self) -> Iterator[InferenceResponse]:
        if self._finished:
            self._next = 0
        return self

    def __next__(self) -> InferenceResponse:
        if self._next < len(self._responses):
            self._next += 1
            return self._responses[self._next - 1]
        if self._finished:
            raise StopIteration
        response, final = self._pending.get()
        self._responses.append(response)
        self._next += 1
        self._finished = final
        return response

    def cancel(self) -> None:
        """Cancel the called model's request, as in Triton: its ``is_cancelled()`` turns true
        and the iteration goes on with whatever it still sends (a model that honours the
        cancel ends with a CANCELLED error response; one that ignores it runs to its end). A
        call whose request has not started yet ends at once with a CANCELLED error response.
        Does nothing once the call finished."""
        if self._cancel is not None:
            self._cancel()

    def _push(self, response: InferenceResponse | None, final: bool) -> None:
        """Queue one response (``None``: a flags-only FINAL, seen as an empty response)."""
        self._pending.put((InferenceResponse() if response is None else response, final))
        self._first.set()

    def _wait_first(self) -> None:
        """Block until the first response has come (Triton's exec returns the iterator then,
        so an ``async_exec`` awaits it and iterating does not block the model's loop)."""
        self._first.wait()
