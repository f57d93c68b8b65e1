"""The bytes of an output tensor, checked against its shape: shared by both frontends."""

from __future__ import annotations

from shoal.core import InferOutput, InternalError, byte_size


def output_bytes(output: InferOutput) -> memoryview:
    """A flat byte view of ``output.data``; a size that disagrees with the shape is a bug."""
    data = memoryview(output.data)
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
