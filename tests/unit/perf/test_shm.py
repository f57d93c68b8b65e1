import os

import pytest

from shoal.perf.requests import ShmRef
from shoal.perf.shm import ShmRegion, plan_layout
from shoal.perf.tensors import random_tensor

pytestmark = pytest.mark.timeout(10)


def test_inputs_once_then_one_output_slot_per_worker():
    inputs = [random_tensor("A", "FP32", (16,)), random_tensor("B", "FP32", (3,))]
    layout = plan_layout("r", inputs, [("OUT0", 64), ("OUT1", 10)], workers=3)
    assert layout.inputs == {"A": ShmRef("r", 0, 64), "B": ShmRef("r", 64, 12)}
    assert len(layout.outputs) == 3
    offsets = [ref.offset for slot in layout.outputs for ref in slot.values()]
    assert offsets == [128, 192, 256, 320, 384, 448]  # 64-byte aligned, never overlapping
    assert layout.byte_size == 512


def test_a_region_is_written_and_unlinked():
    name = f"shoal_perf_test_{os.getpid()}"
    region = ShmRegion(name, 4096)
    try:
        assert region.key == f"/{name}"
        region.write(100, b"hello")
        with open(f"/dev/shm/{name}", "rb") as f:
            f.seek(100)
            assert f.read(5) == b"hello"
    finally:
        region.close()
    assert not os.path.exists(f"/dev/shm/{name}")
