"""Which requests a BLS call made by a model serves (``bls.current_callers``): the batch whose
``execute`` runs on this thread, or the one in the context (``async def execute``, and every
context copied during an execute once the model has built a BLS request)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Iterator

import pytest

from shoal.ipc import messages as msg
from shoal.ipc.arena import OwnedArena
from shoal.stub import pb_utils
from shoal.stub.bls import current_callers
from shoal.stub.executor import BatchExecutor
from shoal.stub.memory import Locations, SharedOutputArena
from shoal.stub.open_requests import CALLING
from shoal.stub.tensors_out import TensorWriter

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def arena() -> Iterator[OwnedArena]:
    arena = OwnedArena(7, initial_bytes=1 << 16, growth_bytes=1 << 16, limit_bytes=1 << 20)
    yield arena
    arena.close()


@pytest.fixture(params=[False, True], ids=["plain", "exact"])
def exact(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Both ways: before and after the model built a BLS request."""
    saved = CALLING.exact
    CALLING.exact = request.param
    yield request.param
    CALLING.exact = saved


def _keys(callers: tuple) -> list[int]:
    return [key for key, _ in callers]


def _run(model: object, arena: OwnedArena, keys: list[int], concurrent: bool = False) -> None:
    writer = TensorWriter(SharedOutputArena(arena), Locations())
    executor = BatchExecutor(
        "m_0",
        model,
        writer,
        lambda location: memoryview(b""),
        lambda message: None,
        False,
        lambda location, view: view,
        concurrent_async=concurrent,
    )
    records = [msg.RequestRecord(f"r{k}", 0, 0, {}, [], [], key=k) for k in keys]
    assert executor.run(msg.Execute(1, records)) is not None


def test_a_plain_execute_serves_its_batch_on_its_own_thread(arena, exact) -> None:
    seen: dict[str, object] = {}

    class Model:
        def execute(self, requests):
            seen["execute"] = _keys(current_callers())
            other = threading.Thread(target=lambda: seen.update(thread=current_callers()))
            other.start()
            other.join()
            seen["copied"] = contextvars.copy_context()
            return [pb_utils.InferenceResponse([]) for _ in requests]

    _run(Model(), arena, [3, 4])
    assert seen["execute"] == [3, 4]
    assert seen["thread"] == ()  # a plain thread starts with an empty context, as before
    assert current_callers() == ()  # nothing runs now
    # A context copied during execute keeps its batch once the model made BLS requests.
    copied = seen["copied"]
    assert isinstance(copied, contextvars.Context)
    assert _keys(copied.run(current_callers)) == ([3, 4] if exact else [])


def test_an_async_execute_and_its_tasks_serve_their_own_batch(arena, exact) -> None:
    seen: list[tuple[str, list[int]]] = []

    class Model:
        async def execute(self, requests):
            async def child():
                return _keys(current_callers())

            await asyncio.sleep(0)
            seen.append((requests[0].request_id(), _keys(current_callers())))
            seen.append(("task", await asyncio.ensure_future(child())))
            return [pb_utils.InferenceResponse([]) for _ in requests]

    _run(Model(), arena, [5])
    _run(Model(), arena, [6, 7])
    assert seen == [("r5", [5]), ("task", [5]), ("r6", [6, 7]), ("task", [6, 7])]


def test_concurrent_async_executes_keep_their_own_callers(arena) -> None:
    """``async_execute_concurrency``: batches interleave on one loop, each with its callers."""
    both_started = threading.Barrier(2, timeout=10)
    seen: dict[str, list[int]] = {}
    finished = threading.Event()

    class Model:
        async def execute(self, requests):
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, both_started.wait)  # the other is in flight too
            seen[requests[0].request_id()] = _keys(current_callers())
            if len(seen) == 2:
                finished.set()
            return [pb_utils.InferenceResponse([]) for _ in requests]

    writer = TensorWriter(SharedOutputArena(arena), Locations())
    executor = BatchExecutor(
        "m_0",
        Model(),
        writer,
        lambda location: memoryview(b""),
        lambda message: None,
        False,
        lambda location, view: view,
        concurrent_async=True,
    )
    for keys in ([8], [9, 10]):
        records = [msg.RequestRecord(f"r{k}", 0, 0, {}, [], [], key=k) for k in keys]
        assert executor.run(msg.Execute(1, records)) is None  # runs on concurrently
    assert finished.wait(10)
    assert seen == {"r8": [8], "r9": [9, 10]}


def test_building_a_bls_request_turns_the_context_on() -> None:
    saved = CALLING.exact
    CALLING.exact = False
    try:
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
        assert CALLING.exact
    finally:
        CALLING.exact = saved
