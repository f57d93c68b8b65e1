"""The core's answers to a worker's calls, as link frames carry them (``_wire.py`` frames them).

:func:`response_to_wire` / :func:`response_from_wire` carry an ``InferResponse`` the core made;
:func:`relayed_from_wire` reads a relayed answer (``answer_frames.record_to_wire``: the stub's
record, its constant part packed once per model version as a layout, :func:`layout_of`). An
output's bytes follow the header, or the worker reads them in place from the block the core
describes (``[arena, segment, offset, nbytes]``) and releases its lease once they are written.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgpack

from shoal.core.types import InferOutput, InferResponse
from shoal.frontends.workers._plain import as_shoal_error, error_from_wire, error_to_wire
from shoal.ipc.whole_results import read_record

#: The core's choice for one output: ``[arena, segment, offset, nbytes]`` of a block the worker
#: reads in place, or None (its bytes follow the header).
Describe = Callable[[InferOutput], list[int] | None]
#: The worker's view of such a block.
ViewBlock = Callable[[list[int]], memoryview]


def response_to_wire(
    response: InferResponse,
    payloads: list[memoryview | bytes],
    describe: Describe | None = None,
    lease: int = 0,
) -> list[Any]:
    """The response's fields; output bytes go to ``payloads`` unless ``describe`` gives their
    block (then the core holds the response until the worker releases ``lease``)."""
    outputs = []
    for output in response.outputs:
        where = None if describe is None else describe(output)
        if where is None:
            payloads.append(output.data)
        outputs.append([output.name, output.datatype, list(output.shape), output.parameters, where])
    error = None if response.error is None else error_to_wire(response.error)
    return [
        response.model_name,
        response.model_version,
        response.id,
        outputs,
        response.parameters,
        response.final,
        error,
        lease,
    ]


def response_from_wire(
    fields: Sequence[Any],
    payloads: list[memoryview],
    view: ViewBlock | None = None,
    release: Callable[[int], None] | None = None,
) -> InferResponse:
    """The response the core sent; outputs it described are read through ``view``, and
    ``release`` tells the core once they are written (the response's ``release``)."""
    if type(fields[0]) is bytes:
        return relayed_from_wire(fields, payloads, view, release)
    model_name, model_version, response_id, outputs, parameters, final, error, lease = fields
    tensors, at = [], 0
    for name, datatype, shape, params, where in outputs:
        data, at = _output_bytes(name, where, payloads, at, view)
        tensors.append(InferOutput(name, datatype, tuple(shape), data, params))
    return InferResponse(
        model_name,
        model_version,
        response_id,
        tensors,
        parameters,
        _release=_releaser(lease, release),
        final=final,
        error=None if error is None else as_shoal_error(error_from_wire(error)),
    )


def relayed_from_wire(
    fields: Sequence[Any],
    payloads: list[memoryview],
    view: ViewBlock | None = None,
    release: Callable[[int], None] | None = None,
) -> InferResponse:
    """The response the core would have made from a stub's record (final, no error, no output
    parameters), from its relayed answer (``answer_frames.record_to_wire``)."""
    if len(fields) == 2:
        return whole_from_wire(fields, payloads)
    packed, response_id, shapes, wheres, parameters, lease = fields
    model_name, model_version, names, datatypes = layout_of(packed)
    tensors, at = [], 0
    for i, shape in enumerate(shapes):
        where = None if wheres is None else wheres[i]
        data, at = _output_bytes(names[i], where, payloads, at, view)
        tensors.append(InferOutput(names[i], datatypes[i], tuple(shape), data, {}))
    return InferResponse(
        model_name,
        model_version,
        response_id,
        tensors,
        parameters,
        _release=_releaser(lease, release),
        final=True,
    )


def whole_from_wire(fields: Sequence[Any], payloads: list[memoryview]) -> InferResponse:
    """The response from a relayed answer that carries the stub's record as it came
    (``answer_frames.head`` and the record's bytes, every output inline): what
    :func:`relayed_from_wire` makes of the same record. A record that is not such a success
    is a ValueError."""
    packed, response_id = fields
    model_name, model_version = layout_of(packed)
    outputs, error, parameters = read_record(payloads[0])
    if error is not None:
        raise ValueError(f"a relayed record carries an error: {error!r}")
    tensors = [
        InferOutput(name, datatype, shape, data, {}) for name, datatype, shape, data in outputs
    ]
    return InferResponse(
        model_name, model_version, response_id, tensors, parameters, _release=None, final=True
    )


#: The layouts of relayed answers decoded so far, by their bytes: a worker decodes each once
#: (forgotten all at once past ``_MOST_LAYOUTS``).
_layouts: Final[dict[bytes, list[Any]]] = {}
_MOST_LAYOUTS: Final = 1024


def layout_of(packed: bytes) -> list[Any]:
    """``[model, version, output names, output datatypes]`` of a relayed answer's layout."""
    known = _layouts.get(packed)
    if known is None:
        if len(_layouts) >= _MOST_LAYOUTS:
            _layouts.clear()
        known = _layouts[packed] = msgpack.unpackb(packed, unicode_errors="surrogatepass")
    return known


def _output_bytes(
    name: str, where: list[int] | None, payloads: list[memoryview], at: int, view: ViewBlock | None
) -> tuple[memoryview, int]:
    """An output's bytes: the next payload (from ``at``), or the block ``where`` names; and
    where the next payload is."""
    if where is None:
        return payloads[at], at + 1
    return _viewed(name, where, view), at


def _viewed(name: str, where: list[int], view: ViewBlock | None) -> memoryview:
    if view is None:
        raise ValueError(f"output '{name}' lies in shared memory this process cannot map")
    return view(where)


def _releaser(lease: int, release: Callable[[int], None] | None) -> Callable[[], None] | None:
    """The response's ``release``: tells the core its lease's blocks are written."""
    if lease and release is not None:
        return functools.partial(release, lease)
    return None
