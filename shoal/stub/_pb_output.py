"""``pb_utils.empty_output_tensor``: an output built in place in the stub's output arena.

shoal's addition to the Python backend's API (Triton has no such call; a model that does not
call it behaves exactly as on Triton). A model that fills a large output can ask for the output's
memory first and write its result there; the response then carries that memory as it is, without
the copy into shared memory that a ``pb_utils.Tensor`` of its own array costs. Portable models
test for it: ``getattr(pb_utils, "empty_output_tensor", None)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shoal.stub._pb_errors import TritonModelException
from shoal.stub._pb_tensor import Tensor

#: Lends a writable array of (name, shape, dtype) in the output arena (the stub runtime sets it;
#: without it, e.g. outside a stub, arrays are ordinary NumPy memory).
Lend = Callable[[str, tuple[int, ...], np.dtype], np.ndarray]

_lend: Lend | None = None


def _set_output_lender(lend: Lend | None) -> None:
    global _lend
    _lend = lend


def empty_output_tensor(name: str, shape: Sequence[int], dtype: Any) -> Tensor:
    """A ``pb_utils.Tensor`` named ``name`` over uninitialised memory of ``shape`` and ``dtype``
    in the stub's output arena: write the result into ``tensor.as_numpy()`` (a writable array),
    then return the tensor in a response. Do not change the array after that. BYTES outputs have
    no fixed size and are refused (build them with ``pb_utils.Tensor``)."""
    try:
        dims = tuple(int(d) for d in shape)
        kind = np.dtype(dtype)
    except (TypeError, ValueError) as error:
        raise TritonModelException(f"empty_output_tensor '{name}': {error}") from None
    if any(d < 0 for d in dims):
        raise TritonModelException(f"empty_output_tensor '{name}': negative shape {list(dims)}")
    if kind.kind in "OSU":
        raise TritonModelException(
            f"empty_output_tensor '{name}': BYTES outputs have no fixed size; "
            "build them with pb_utils.Tensor"
        )
    kind = kind.newbyteorder("<") if kind.byteorder == ">" else kind
    array = _lend(name, dims, kind) if _lend is not None else np.empty(dims, dtype=kind)
    return Tensor(name, array)
