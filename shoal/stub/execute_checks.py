"""What Triton's contract asks of ``execute``'s return value, checked with Triton's words."""

from __future__ import annotations

import logging
from typing import Any, Final

from shoal.stub import _pb_request
from shoal.stub._pb_errors import TritonError, TritonModelException
from shoal.stub._pb_response import InferenceResponse

RESCHEDULE = 2  # TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
#: The lock under which a request's sender is made or its response marked returned.
_SENDER_MADE: Final = _pb_request._SENDER_MADE
# Bound once: compiled, ``_SENDER_MADE.acquire()`` looks the method up on every call.
_acquire_sender: Final = _SENDER_MADE.acquire
_release_sender: Final = _SENDER_MADE.release
log = logging.getLogger("shoal.stub")


class ExecuteError(Exception):
    """The model's execute raised or returned something Triton's contract forbids."""


def failure_text(instance: str, text: str) -> str:
    """An error text as Triton's Python backend words it for the model's instance."""
    return f"Failed to process the request(s) for model '{instance}', message: {text}"


def check_return(instance: str, result: Any, count: int) -> list[Any]:
    """The responses execute returned for ``count`` requests (all None when it returned None:
    every request is answered through its response sender)."""
    if result is None:
        return [None] * count
    if not isinstance(result, list):
        raise ExecuteError(
            failure_text(
                instance,
                f"Expected a list in the execute return, found type '{type(result).__name__}'.",
            )
        )
    if len(result) != count:
        raise ExecuteError(
            failure_text(
                instance,
                "Number of InferenceResponse objects do not match the number of "
                f"InferenceRequest objects. InferenceRequest(s) size is:{count}, and "
                f"InferenceResponse(s) size is:{len(result)}",
            )
        )
    _check_items(instance, result)
    return result


def _check_items(instance: str, result: list[Any]) -> None:
    for item in result:
        if item is not None and not isinstance(item, InferenceResponse):
            raise ExecuteError(
                failure_text(
                    instance,
                    "Expected an 'InferenceResponse' object in the execute function return "
                    f"list, found type '{type(item).__name__}'.",
                )
            )


def rescheduled_positions(instance: str, requests: list[Any], responses: list[Any]) -> list[int]:
    """Positions of the requests released with RESCHEDULE; each must have returned None."""
    # The attribute, not ``_release_flags()``: a call of interpreted code per request.
    positions = [i for i, r in enumerate(requests) if r._release == RESCHEDULE]
    for i in positions:
        if responses[i] is not None:
            raise ExecuteError(  # Triton's words, its spelling ("reschduled") included
                failure_text(
                    instance,
                    "Expected a None object in the execute function return list for "
                    f"reschduled request, found type '{type(responses[i]).__name__}'.",
                )
            )
    return positions


#: Stands in a batch's responses for a request the model rescheduled (it has none).
RESCHEDULED_MARK: Final[Any] = object()


def settle_all(
    instance: str, requests: list[Any], sent: list[list[Any]], responses: list[Any]
) -> list[int]:
    """Each request's one response in ``responses`` (None: none yet); returns the positions
    of those still to come through a sender the model took."""
    waiting: list[int] = []
    for i in range(len(responses)):  # one of each per request (check_return counted them)
        returned = responses[i]
        if returned is RESCHEDULED_MARK:
            continue
        request = requests[i]
        response = settle(instance, returned, request, sent[i])
        responses[i] = response
        if response is None and request._awaits_sender():
            waiting.append(i)
    return waiting


def settle(instance: str, returned: Any, request: Any, delivered: list[Any]) -> Any:
    """The one response of a request: returned from execute, or sent through its sender.
    One sent with FINAL and also returned: the sent one, as in Triton (the sender was
    closed; the returned one is dropped with a warning)."""
    if returned is None:
        return delivered[0] if delivered else None
    if delivered and request.get_response_sender()._is_closed():
        log.warning(
            "%s",
            failure_text(
                instance,
                "a response was returned for a request whose response sender already "
                "sent its response and the final flag: the returned one is dropped",
            ),
        )
        return delivered[0]
    try:
        # Not through ``get_response_sender()``: that marks the sender taken by the model.
        _mark_returned(request, returned)
    except TritonModelException as error:
        return InferenceResponse(error=TritonError(str(error)))
    return returned


def _mark_returned(request: Any, returned: Any) -> None:
    """``request._mark_returned(returned)``, its usual case (the model took no sender) written
    out here, compiled: that call of interpreted code costs ~1.5k instructions per response.
    Keep in step with ``InferenceRequest._mark_returned``."""
    if request._sender is None:
        _acquire_sender()
        try:
            if request._sender is None:
                request._returned = True
                return
        finally:
            _release_sender()
    request._mark_returned(returned)


#: Request parameters that are request fields in Triton: the model does not see them.
_RESERVED = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output"}
)


def model_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """The request parameters the model sees: those that are not request fields in Triton."""
    if not parameters:
        return {}
    return {k: v for k, v in parameters.items() if k not in _RESERVED}
