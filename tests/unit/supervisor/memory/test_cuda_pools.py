"""The supervisor's CUDA pools without a GPU: who holds each block, and what the metrics say.

Device memory is the ledger of fake pointers from the pool's own unit tests, so what is tested
is the bookkeeping: a block is lent to the stub that asked for it, adopted by the response that
carries it, given back by the stub or freed by its completion, and everything a dead stub was
lent comes back.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.core.errors import InvalidArgument
from shoal.ipc.arena import OwnedArena
from shoal.ipc.cuda import CudaPoolExhausted
from shoal.ipc.tensor import CudaLocation
from shoal.supervisor.extensions.custom_metrics import CustomMetrics
from shoal.supervisor.extensions.metrics import MetricsExporter
from shoal.supervisor.memory.cuda_pools import DEFAULT_LIMIT_BYTES, CudaPools
from tests.unit.ipc.test_cuda_pool import HostLedger

MIB = 1 << 20


def make_pools(**limits: int) -> tuple[CudaPools, HostLedger]:
    ledger = HostLedger()
    pools = CudaPools(
        {int(device[1:]): size for device, size in limits.items()},
        memory=ledger,  # type: ignore[arg-type]
        device_count=lambda: 2,
        chunk_bytes=4 * MIB,
    )
    return pools, ledger


def metrics_text(pools: CudaPools) -> str:
    """What /metrics shows of a server whose only state is ``pools``."""
    service = SimpleNamespace(
        repository=SimpleNamespace(versions=lambda: iter(())),
        input_arena=SimpleNamespace(used_bytes=0, capacity_bytes=0),
        directory=SimpleNamespace(cuda=pools),
        model_statistics=lambda: [],
        custom_metrics=CustomMetrics(),
    )
    return MetricsExporter(service).render().decode()  # type: ignore[arg-type]


def in_use(pools: CudaPools) -> dict[int, int]:
    return {device: pool.used_bytes for device, pool in pools.devices().items()}


def test_no_pool_exists_until_a_gpu_tensor_needs_one() -> None:
    pools, ledger = make_pools()
    assert pools.devices() == {} and ledger.live == {}
    assert pools.limit(0) == DEFAULT_LIMIT_BYTES


def test_a_block_lent_then_adopted_belongs_to_the_response() -> None:
    pools, _ = make_pools()
    assert not pools.lending
    block = pools.allocate(pid=7, device=1, nbytes=1000)
    assert pools.lent_bytes() == 1000 and pools.lending
    assert pools.adopt(7, [block, block]) == [block], "a descriptor seen twice is owned once"
    assert pools.lent_bytes() == 0 and not pools.lending
    pools.forget_process(7)  # the stub dies after handing it on: the response keeps it
    assert in_use(pools) == {1: 1024}
    pools.free([block])
    assert in_use(pools) == {1: 0}


def test_only_blocks_lent_to_that_stub_are_adopted() -> None:
    pools, _ = make_pools()
    block = pools.allocate(pid=7, device=0, nbytes=256)
    assert pools.adopt(8, [block]) == []
    assert pools.adopt(7, [CudaLocation(0, block.offset + 4096, 256)]) == []
    assert pools.lent_bytes() == 256


def test_a_stub_gives_back_what_it_will_not_hand_on() -> None:
    pools, _ = make_pools()
    kept = pools.allocate(pid=7, device=0, nbytes=100)
    returned = pools.allocate(pid=7, device=0, nbytes=100)
    pools.give_back(7, [returned, returned])  # twice: the second is ignored
    pools.give_back(8, [kept])  # not lent to 8: ignored
    assert pools.lent_bytes() == 100
    assert in_use(pools) == {0: 256}


def test_what_a_dead_stub_was_lent_comes_back() -> None:
    pools, _ = make_pools()
    for size in (10, 20 * MIB, 300):
        pools.allocate(pid=9, device=0, nbytes=size)
    other = pools.allocate(pid=10, device=0, nbytes=64)
    pools.forget_process(9)
    assert in_use(pools) == {0: 256} and pools.lending
    assert pools.adopt(10, [other]) == [other]
    assert not pools.lending


def test_limits_apply_per_device_and_exhaustion_names_the_flag() -> None:
    pools, _ = make_pools(d0=8 * MIB)
    pools.allocate(pid=1, device=0, nbytes=6 * MIB)
    with pytest.raises(CudaPoolExhausted, match="--cuda-memory-pool-byte-size 0:<bytes>"):
        pools.allocate(pid=1, device=0, nbytes=4 * MIB)
    pools.allocate(pid=1, device=1, nbytes=16 * MIB)  # device 1 has the default limit
    assert pools.lent_bytes() == 22 * MIB


def test_a_device_the_server_does_not_see_is_refused() -> None:
    pools, _ = make_pools()
    with pytest.raises(InvalidArgument, match="CUDA device 2, but the server sees 2"):
        pools.allocate(pid=1, device=2, nbytes=10)
    with pytest.raises(InvalidArgument, match="positive size"):
        pools.allocate(pid=1, device=0, nbytes=0)


def test_announcements_name_the_chunk_of_a_block() -> None:
    pools, ledger = make_pools()
    pools.allocate(pid=1, device=0, nbytes=4 * MIB)
    second = pools.allocate(pid=1, device=0, nbytes=1000)  # a new chunk
    announce = pools.announcement(second)
    assert (announce.device, announce.chunk, announce.nbytes) == (0, 1, 4 * MIB)
    assert announce.handle == ledger.ipc_handle(0, pools.pointer(second))


def test_retired_chunks_are_reported() -> None:
    pools, _ = make_pools(d0=8 * MIB)
    retired: list[tuple[int, int]] = []
    pools.on_retired_chunk = lambda device, chunk: retired.append((device, chunk))
    small = pools.allocate(pid=1, device=0, nbytes=MIB)
    pools.give_back(1, [small])
    pools.allocate(pid=1, device=0, nbytes=8 * MIB)  # only fits once the empty chunk goes
    assert retired == [(0, 0)]


def test_close_frees_every_chunk() -> None:
    pools, ledger = make_pools()
    pools.allocate(pid=1, device=0, nbytes=MIB)
    pools.allocate(pid=1, device=1, nbytes=MIB)
    pools.close()
    assert ledger.live == {} and pools.devices() == {}


def test_metrics_report_each_pool_once_it_exists() -> None:
    pools, _ = make_pools()
    block = pools.allocate(pid=1, device=1, nbytes=1000)
    pools.allocate(pid=1, device=1, nbytes=3000)
    pools.give_back(1, [block])
    text = metrics_text(pools)
    assert 'shoal_cuda_pool_used_bytes{device="1"} 3072\n' in text
    assert f'shoal_cuda_pool_capacity_bytes{{device="1"}} {4 * MIB}\n' in text
    assert 'shoal_cuda_pool_allocations_total{device="1"} 2\n' in text
    assert 'device="0"' not in text


class FakeStub:
    """What the control router needs of a stub process: its pid, and what it was sent."""

    def __init__(self) -> None:
        self.pid = 4242
        self.returncode: int | None = None
        self.sent: list[object] = []
        self.forwarded: list[object] = []

    def send(self, message: object) -> bool:
        self.sent.append(message)
        return True

    def forward(self, locations: list[object], tensors: object) -> None:
        self.forwarded.extend(locations)


@pytest.fixture
def input_arena() -> Iterator[OwnedArena]:
    with OwnedArena(0, initial_bytes=1 << 16, growth_bytes=1 << 16, limit_bytes=1 << 17) as arena:
        yield arena


def _router(input_arena: OwnedArena, limit: int = 64 * MIB) -> tuple[object, CudaPools, FakeStub]:
    from shoal.supervisor.calls.control import ControlRouter
    from shoal.supervisor.memory.segments import SegmentDirectory

    pools, _ = make_pools(d0=limit)
    directory = SegmentDirectory(input_arena, pools)
    router = ControlRouter(None, CustomMetrics(), directory)  # type: ignore[arg-type]
    return router, pools, FakeStub()


def _call(router: object, stub: FakeStub, op: object, *args: object, call_id: int = 7) -> object:
    from shoal.ipc import messages as msg

    caller = SimpleNamespace(name="m_0")
    router.handle(caller, stub, msg.ControlCall(call_id, op, list(args)))  # type: ignore[attr-defined]
    return stub.sent[-1] if stub.sent else None


def test_a_stub_asks_for_a_block_and_gets_its_chunk_first(input_arena: OwnedArena) -> None:
    from shoal.ipc.call_messages import ControlOp

    router, pools, stub = _router(input_arena)
    reply = _call(router, stub, ControlOp.CUDA_ALLOCATE, 0, 1000)
    assert reply.error is None  # type: ignore[attr-defined]
    block = CudaLocation(*reply.value)  # type: ignore[attr-defined]
    assert stub.forwarded == [block], "the chunk's handle goes to the stub before the reply"
    assert pools.lent_bytes() == 1000
    stub.sent.clear()
    assert _call(router, stub, ControlOp.CUDA_FREE, [0, block.offset, 1000], call_id=0) is None
    assert pools.lent_bytes() == 0


def test_refused_blocks_answer_with_the_reason(input_arena: OwnedArena) -> None:
    from shoal.ipc.call_messages import ControlOp

    router, pools, stub = _router(input_arena, limit=4 * MIB)
    exhausted = _call(router, stub, ControlOp.CUDA_ALLOCATE, 0, 8 * MIB)
    assert "--cuda-memory-pool-byte-size 0:<bytes>" in exhausted.error  # type: ignore[attr-defined]
    malformed = _call(router, stub, ControlOp.CUDA_ALLOCATE, "zero")
    assert "malformed CUDA_ALLOCATE" in malformed.error  # type: ignore[attr-defined]
    no_device = _call(router, stub, ControlOp.CUDA_ALLOCATE, 5, 10)
    assert "CUDA device 5, but the server sees 2" in no_device.error  # type: ignore[attr-defined]
    _call(router, stub, ControlOp.CUDA_FREE, ["not", "a", "block"], call_id=0)  # logged, ignored
    assert pools.lent_bytes() == 0


operations = st.lists(
    st.tuples(
        st.sampled_from(["allocate", "adopt", "give_back", "free_owned", "forget"]),
        st.integers(0, 2),  # which stub
        st.integers(1, 3 * MIB),  # size, or which block
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_random_traffic_never_loses_or_double_frees_a_block(
    ops: list[tuple[str, int, int]],
) -> None:
    """Whatever stubs do, in any order, every block is freed exactly once: once everything owned
    is freed and every stub is gone, the pools hold no used bytes."""
    pools, _ = make_pools(d0=16 * MIB)
    lent: dict[int, list[CudaLocation]] = {0: [], 1: [], 2: []}
    owned: list[CudaLocation] = []
    for op, stub, value in ops:
        if op == "allocate":
            try:
                lent[stub].append(pools.allocate(pid=stub, device=0, nbytes=value))
            except CudaPoolExhausted:
                pass
        elif op == "adopt" and lent[stub]:
            block = lent[stub].pop(value % len(lent[stub]))
            assert pools.adopt(stub, [block]) == [block]
            owned.append(block)
        elif op == "give_back" and lent[stub]:
            pools.give_back(stub, [lent[stub].pop(value % len(lent[stub]))])
        elif op == "free_owned" and owned:
            pools.free([owned.pop(value % len(owned))])
        elif op == "forget":
            pools.forget_process(stub)
            lent[stub] = []
        assert pools.lent_bytes() == sum(b.nbytes for blocks in lent.values() for b in blocks)
    pools.free(owned)
    for stub in lent:
        pools.forget_process(stub)
    assert all(used == 0 for used in in_use(pools).values())
    assert not pools.lending


def test_a_pool_limit_of_zero_turns_the_pool_off(input_arena: OwnedArena) -> None:
    from shoal.ipc.call_messages import ControlOp

    router, pools, stub = _router(input_arena, limit=0)  # --cuda-memory-pool-byte-size 0:0
    reply = _call(router, stub, ControlOp.CUDA_ALLOCATE, 0, 1000)
    assert reply.error is None and reply.value is None  # type: ignore[attr-defined]
    assert pools.devices() == {}, "no pool, no device memory"


def test_a_stub_that_exited_gets_no_block(input_arena: OwnedArena) -> None:
    from shoal.ipc.call_messages import ControlOp

    router, pools, stub = _router(input_arena)
    stub.returncode = -9  # type: ignore[attr-defined]
    assert _call(router, stub, ControlOp.CUDA_ALLOCATE, 0, 1000) is None
    assert pools.lent_bytes() == 0


def test_a_first_refusal_leaves_metrics_readable() -> None:
    pools, _ = make_pools(d0=4 * MIB)
    with pytest.raises(CudaPoolExhausted):
        pools.allocate(pid=1, device=0, nbytes=8 * MIB)
    text = metrics_text(pools)
    assert 'shoal_cuda_pool_allocations_total{device="0"} 0\n' in text


def test_a_release_after_shutdown_is_harmless() -> None:
    pools, _ = make_pools()
    block = pools.allocate(pid=1, device=0, nbytes=100)
    pools.adopt(1, [block])
    pools.close()
    pools.free([block])  # a frontend that finished writing after the server stopped
