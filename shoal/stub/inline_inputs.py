"""A small input carried inside the Execute, as the model's own writable array.

An input of up to ``tensor.INLINE_TENSOR_MAX`` bytes travels in its request's record
(``InlineBytes``); the model gets its own copy, which it may write, as Triton's models may.
``tensor.buffer_to_numpy`` takes any shape and buffer, and pays for it on every request: its
shape rebuilt through a generator of ``int()`` calls, the byte size through two generic helpers,
a type test of the buffer (~4.7k instructions compiled, for a 64-byte input). A descriptor read
from an Execute has a tuple of ints for a shape, so :func:`inline_array` computes the size
natively; any datatype it does not know, or a size that does not match, goes to
``buffer_to_numpy``, which raises its own error.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from shoal.ipc.dtypes import NUMPY_DTYPES
from shoal.ipc.tensor import buffer_to_numpy

__all__ = ["inline_array"]

#: Each fixed-size datatype's NumPy dtype and bytes per element (BYTES is decoded, elsewhere).
_LAYOUTS: Final[dict[str, tuple[np.dtype, int]]] = {
    name: (dtype, dtype.itemsize) for name, dtype in NUMPY_DTYPES.items() if name != "BYTES"
}
#: Bound once: a look-up in the module ``np`` costs a dict search per call.
_frombuffer: Final = np.frombuffer


def inline_array(datatype: str, shape: tuple[int, ...], data: bytes) -> np.ndarray:
    """A writable array of ``shape`` over a copy of ``data`` (what
    ``buffer_to_numpy(datatype, shape, bytearray(data), readonly=False)`` gives)."""
    layout = _LAYOUTS.get(datatype)
    if layout is None:  # BYTES (decoded into objects) or unknown: the general way
        return buffer_to_numpy(datatype, shape, bytearray(data), readonly=False)
    count = 1
    for dim in shape:
        count *= dim
    if count * layout[1] != len(data):  # its error, word for word
        return buffer_to_numpy(datatype, shape, bytearray(data), readonly=False)
    array = _frombuffer(bytearray(data), layout[0])
    # frombuffer gives the 1-D shape already (the usual input): a reshape costs ~1.6k.
    return array if len(shape) == 1 else array.reshape(shape)
