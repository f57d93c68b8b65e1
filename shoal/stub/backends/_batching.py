"""The ``execute`` of a built-in backend: a batch of requests, one run of the framework.

A backend gives two callables: ``feed(request)``, the request's inputs as NumPy arrays by name,
and ``run(names, feed)``, the outputs ``names`` as NumPy arrays. :class:`Batching` does the
rest, the same for every framework:

* With ``max_batch_size > 0`` and more than one request, each input is concatenated along the
  first (batch) dimension and the framework runs **once**; each output is split back into
  per-request views. A single request's inputs are passed as they are (no copy).
* Only the outputs some request asked for are computed (every configured one for a request
  that named none), and each response carries the outputs its request asked for.
* A :class:`BackendModelError` while feeding fails only that request; while running, every
  request of the run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shoal.stub import pb_utils
from shoal.stub.backends._config import BackendModelError, ConfigTensor

Feed = dict[str, np.ndarray]
FeedFn = Callable[[Any], Feed]
RunFn = Callable[[list[str], Feed], list[np.ndarray]]


@dataclass
class Batching:
    """How one model instance runs a batch of requests; see the module's documentation.

    ``state_outputs`` are the sequence batcher's implicit-state outputs (requested by the
    supervisor though not in ``outputs``); ``scalar_outputs`` are rank-0 outputs that clients
    see in their configured dims (ones: ``[1]``, ``[1,1]``...).
    """

    model: str
    max_batch_size: int
    outputs: Mapping[str, ConfigTensor]
    state_outputs: Sequence[str] = ()
    scalar_outputs: frozenset[str] = field(default_factory=frozenset)

    def execute(self, requests: Sequence[Any], feed: FeedFn, run: RunFn) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        feeds: list[tuple[int, Feed]] = []
        for index, request in enumerate(requests):
            try:
                feeds.append((index, feed(request)))
            except BackendModelError as error:
                responses[index] = error_response(f"model '{self.model}': {error}")
        if self.max_batch_size > 0 and len(feeds) > 1:
            self._run_batched(requests, feeds, run, responses)
        else:
            for index, one in feeds:
                self._run_one(requests[index], index, one, run, responses)
        return responses

    def wanted(self, requests: Sequence[Any]) -> list[str]:
        """The outputs to compute: those any request asked for (every configured one for a
        request that named none), in configuration order, then implicit-state outputs."""
        wanted: set[str] = set()
        for request in requests:
            names = request.requested_output_names()
            wanted.update(names or self.outputs)
        known = [*self.outputs, *(n for n in self.state_outputs if n not in self.outputs)]
        return [name for name in known if name in wanted]

    def _run_one(
        self, request: Any, index: int, feed: Feed, run: RunFn, responses: list[Any]
    ) -> None:
        names = self.wanted([request])
        try:
            results = run(names, feed)
        except BackendModelError as error:
            responses[index] = error_response(str(error))
            return
        responses[index] = self._response(names, results, self.batch_of(feed))

    def _response(self, names: list[str], values: list[np.ndarray], batch: int) -> Any:
        tensors = [
            pb_utils.Tensor(name, self.client_shape(name, value, batch))
            for name, value in zip(names, values, strict=True)
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _run_batched(
        self,
        requests: Sequence[Any],
        feeds: list[tuple[int, Feed]],
        run: RunFn,
        responses: list[Any],
    ) -> None:
        """One run over the requests concatenated along the batch dimension."""
        indices = [index for index, _ in feeds]
        sizes = [self.batch_of(feed) for _, feed in feeds]
        try:
            joined = concatenate(self.model, [f for _, f in feeds])
            names = self.wanted([requests[i] for i in indices])
            outputs = run(names, joined)
            self._check_batch_dim(names, outputs, sum(sizes))
        except BackendModelError as error:
            for index in indices:
                responses[index] = error_response(str(error))
            return
        bounds = np.cumsum(sizes)[:-1]
        parts = [np.split(value, bounds) for value in outputs]
        for slot, (index, size) in enumerate(zip(indices, sizes, strict=True)):
            requested = requests[index].requested_output_names()
            tensors = [
                pb_utils.Tensor(name, self.client_shape(name, part[slot], size))
                for name, part in zip(names, parts, strict=True)
                if not requested or name in requested
            ]
            responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)

    def _check_batch_dim(self, names: list[str], outputs: list[np.ndarray], total: int) -> None:
        for name, value in zip(names, outputs, strict=True):
            if value.ndim == 0 or value.shape[0] != total:
                raise BackendModelError(
                    f"output '{name}' of model '{self.model}' has shape {list(value.shape)} "
                    f"for a batch of {total}: a batching model's outputs must have the batch "
                    "size as first dimension"
                )

    def batch_of(self, feed: Mapping[str, np.ndarray]) -> int:
        """The batch size of one request's inputs (0 for a model that does not batch)."""
        if self.max_batch_size == 0:
            return 0
        for array in feed.values():
            if array.ndim > 0:
                return int(array.shape[0])
        return 1

    def client_shape(self, name: str, value: np.ndarray, batch: int) -> np.ndarray:
        """The output in the shape the configuration gives the client (its ``dims``)."""
        spec = self.outputs.get(name)
        if name in self.scalar_outputs and value.ndim == 0:
            return value.reshape(spec.dims if spec is not None else (1,))
        if spec is None or not spec.has_reshape:
            return value
        shape = ((batch,) if self.max_batch_size > 0 else ()) + spec.dims
        if sum(1 for d in shape if d < 0) > 1:
            return value  # cannot infer more than one variable dim: leave the model's shape
        try:
            return value.reshape(shape)
        except ValueError:
            return value


def concatenate(model: str, feeds: list[Feed]) -> Feed:
    """The requests' inputs joined along the batch dimension (one copy of each)."""
    names = list(feeds[0])
    for feed in feeds[1:]:
        if set(feed) != set(names):
            raise BackendModelError(
                f"the requests batched for model '{model}' carry different inputs "
                f"({sorted(names)} and {sorted(feed)}); optional inputs must be given by all "
                "requests of a batch or by none"
            )
    joined = {}
    for name in names:
        arrays = [feed[name] for feed in feeds]
        try:
            joined[name] = np.concatenate(arrays, axis=0)
        except ValueError:
            shapes = ", ".join(str(list(a.shape)) for a in arrays)
            raise BackendModelError(
                f"input '{name}' of the requests batched for model '{model}' cannot be "
                f"concatenated along the batch dimension (shapes {shapes})"
            ) from None
    return joined


def error_response(message: str) -> Any:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


__all__ = ["Batching", "Feed", "concatenate", "error_response"]
