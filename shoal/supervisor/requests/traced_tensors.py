"""The tensors of a request traced at level TENSORS, written as Triton writes them: each
element's value, comma-separated (``"0.5,1,2"``; BYTES elements in double quotes), the shape
the same way, and the V2 datatype.

Read only for traced requests, from where they are: inline in the message or in an arena block
(the inputs when the request is queued, the outputs when the stub's answer is read). Tensors
elsewhere (client shared memory, CUDA) are written with empty data; so are BF16's, which NumPy
has no type for (Triton writes FP16's and BF16's empty; shoal writes FP16's). A request a
frontend worker packed has its inputs in the packed head, read back here.
"""

from __future__ import annotations

from collections.abc import Callable

import msgpack
import numpy as np

from shoal.ipc import whole_results
from shoal.ipc.arena import Block
from shoal.ipc.dtypes import NUMPY_DTYPES
from shoal.ipc.records import RequestRecord, ResponseRecord
from shoal.ipc.tensor import InlineBytes, TensorDesc
from shoal.supervisor.extensions.trace_files import Trace

#: Reads an arena block (``SegmentDirectory.view``).
Viewer = Callable[[Block], memoryview]


def trace_inputs(trace: Trace, record: RequestRecord, view: Viewer) -> None:
    """TENSOR_QUEUE_INPUT for each input (the request enters its queue)."""
    for desc in _inputs(record):
        _trace_tensor(trace, "TENSOR_QUEUE_INPUT", desc, view)


def trace_outputs(trace: Trace, response: ResponseRecord, view: Viewer) -> None:
    """TENSOR_BACKEND_OUTPUT for each output of the model's response."""
    if response.whole is not None:  # relayed to a worker undecoded: decoded for the trace
        response = whole_results.response_of(response.whole)
    for desc in response.outputs:
        _trace_tensor(trace, "TENSOR_BACKEND_OUTPUT", desc, view)


def trace_named(
    trace: Trace | None, activity: str, tensors: dict[str, TensorDesc], view: Viewer
) -> None:
    """``activity`` for each tensor under its given name, if ``trace`` traces tensors (an
    ensemble's inputs and outputs: descriptors may carry a composing model's names)."""
    if trace is None or not trace.tensors:
        return
    for name, desc in tensors.items():
        _trace_tensor(trace, activity, desc, view, name)


def _inputs(record: RequestRecord) -> list[TensorDesc]:
    """A request's inputs: its record's, or those in the head a frontend worker packed (the
    record's wire form, ``RequestRecord.to_wire``, up to its timeout: inputs are the sixth)."""
    if record.packed is None:
        return record.inputs
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(record.packed)
    try:
        unpacker.read_array_header()
        for _ in range(5):
            unpacker.skip()
        return [TensorDesc.from_wire(wire) for wire in unpacker.unpack()]
    except (ValueError, TypeError, msgpack.UnpackException):  # not for a trace to fail on
        return []


def _trace_tensor(
    trace: Trace, activity: str, desc: TensorDesc, view: Viewer, name: str | None = None
) -> None:
    location = desc.location
    data = None
    if type(location) is InlineBytes:
        data = memoryview(location.data)
    elif type(location) is Block:
        try:
            data = view(location)
        except Exception:  # (an arena the core cannot map): a trace never fails a request
            data = None
    shape = ",".join(str(d) for d in desc.shape)
    text = "" if data is None else values(desc.datatype, data)
    trace.tensor(activity, desc.name if name is None else name, desc.datatype, shape, text)


def values(datatype: str, data: memoryview) -> str:
    """A tensor's elements as Triton writes them ("" where they cannot be read)."""
    if datatype == "BYTES":
        return ",".join(f'"{item}"' for item in _strings(data))
    dtype = NUMPY_DTYPES.get(datatype)
    if dtype is None or datatype == "BF16":  # (BF16 is held as uint16: not its values)
        return ""
    try:
        array = np.frombuffer(data, dtype=dtype)
    except ValueError:  # a size that is not a whole number of elements
        return ""
    if datatype == "BOOL":
        return ",".join("1" if v else "0" for v in array.tolist())
    if array.dtype.kind == "f":
        return ",".join(format(v, "g") for v in array.tolist())
    return ",".join(str(v) for v in array.tolist())


def _strings(data: memoryview) -> list[str]:
    """BYTES elements (4-byte little-endian length, then the bytes), as text; stops where
    a length runs past the data, as Triton does."""
    items = []
    offset = 0
    raw = bytes(data)
    while offset + 4 <= len(raw):
        length = int.from_bytes(raw[offset : offset + 4], "little")
        offset += 4
        if offset + length > len(raw):
            break
        items.append(raw[offset : offset + length].decode("utf-8", "backslashreplace"))
        offset += length
    return items
