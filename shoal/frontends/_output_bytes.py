"""The bytes of an output tensor, checked against its shape: shared by both frontends."""

from __future__ import annotations

from typing import Final

from shoal.core import InferOutput, InternalError, byte_size

#: Compiled, the builtin's name is a look-up on the ``builtins`` module at each use.
_memoryview: Final = memoryview


def output_bytes(output: InferOutput) -> memoryview:
    """A flat byte view of ``output.data``; a size that disagrees with the shape is a bug."""
    data = output.data
    if type(data) is not _memoryview:  # a view (most outputs) is used as it is, not wrapped again
        data = _memoryview(data)
    if data.format != "B" or data.ndim != 1:
        data = data.cast("B")
    expected = byte_size(output.datatype, output.shape)
    if expected is not None and data.nbytes != expected:
        raise InternalError(
            f"output tensor shape does not match size of output for '{output.name}': "
            f"shape {list(output.shape)} of {output.datatype} needs {expected} bytes, "
            f"got {data.nbytes}"
        )
    return data
