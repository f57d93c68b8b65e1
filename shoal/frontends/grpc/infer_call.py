"""ModelInfer as shoal's own gRPC server runs it: its guard, the request, the core, the reply.

This is :meth:`~shoal.frontends.grpc.servicer.Servicer.model_infer` inside the guard every
method has (:func:`shoal.frontends.grpc.methods._guarded`: the restricted-protocol check, errors
as the call's status), written once for the one method that runs per inference, so that it is
compiled with the rest of the call's path: two interpreted coroutines, stepped through on every
resumption of the call, are one compiled one. The reply may view the response's memory
(:class:`LentReply`) instead of copying large outputs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final

from shoal.core import CoreAPI, InferResponse, ShoalError
from shoal.frontends._failed_log import infer_failed
from shoal.frontends._forwarding import HeaderForward
from shoal.frontends._restricted import GRPC_GROUPS, Restrictions
from shoal.frontends.grpc._infer import DecodedInfer, decode_infer_request, encode_infer_response
from shoal.frontends.grpc._wire import Chunk
from shoal.frontends.grpc.servicer import unexpected
from shoal.frontends.grpc.status import GRPC_STATUS, Status

#: An output of at least this many bytes is written from lent memory rather than copied.
LEND_FROM: Final = 64 * 1024
_GROUP: Final = GRPC_GROUPS["ModelInfer"]
#: ``memoryview``, read once: compiled, the name of a builtin mypyc has no primitive for is an
#: attribute look-up on the ``builtins`` module (~270 instructions) at each use.
_memoryview: Final = memoryview


class LentReply:
    """A serialized reply whose chunks view memory lent by the core (a response's outputs,
    read in place): ``release`` gives it back, once the chunks have been written out."""

    __slots__ = ("chunks", "release")

    def __init__(self, chunks: list[Chunk], release: Callable[[], None]) -> None:
        self.chunks = chunks
        self.release = release


class InferCall:
    """ModelInfer over ``core``, guarded by ``restrictions`` (see the module)."""

    def __init__(
        self, core: CoreAPI, restrictions: Restrictions, forward: HeaderForward | None = None
    ) -> None:
        self._core = core
        self._restrictions = restrictions
        #: ``--grpc-header-forward-pattern``: the metadata the request's parameters get.
        self._forward = forward

    async def handle(self, data: Any, context: Any) -> LentReply | bytes:
        """The reply to the serialized request ``data``; an error ends the call through
        ``context.abort`` with its status, as every guarded method does. One coroutine, the
        guard and the inference in it: each level is entered and resumed on every step."""
        request_id = ""
        try:
            restrictions = self._restrictions
            if restrictions.restricts(_GROUP):
                restrictions.check(_GROUP, context.invocation_metadata() or ())
            decoded = decode_infer_request(data)
            request = decoded.request
            request_id = request.id
            forward = self._forward
            if forward is not None:
                forwarded = forward.matching(context.invocation_metadata() or ())
                request.parameters.update(forwarded)
            request.trace_id = -1  # its frontend hands its timestamps (trace_files.py)
            try:
                response = await self._core.infer(request)
            finally:
                if request.trace_id > 0:  # traced: the call hands them once sent (CallContext)
                    context.traced = functools.partial(self._core.frontend_trace, request.trace_id)
            return _reply(response, decoded)
        except ShoalError as exc:
            error = exc
        except Exception:
            error = unexpected("ModelInfer")
        infer_failed(request_id, error.message)
        await context.abort(GRPC_STATUS.get(error.code, Status.INTERNAL), error.message)
        raise AssertionError("abort returned")  # it raises: the call ends with the status


def _reply(response: InferResponse, decoded: DecodedInfer) -> LentReply | bytes:
    """Small replies are copied (following the writes would cost more than the copy)."""
    try:
        chunks = encode_infer_response(response, decoded)
        if _lendable(chunks):
            return LentReply(chunks, response.release)
    except BaseException:
        response.release()
        raise
    try:
        return b"".join(chunks)
    finally:
        response.release()


def _lendable(chunks: list[Chunk]) -> bool:
    return any(isinstance(chunk, _memoryview) and chunk.nbytes >= LEND_FROM for chunk in chunks)
