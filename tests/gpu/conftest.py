"""GPU tests: every test here is skipped unless cupy imports and sees a CUDA device.

They run on a GPU machine with ``pip install -e '.[test,gpu]' && pytest -q tests/gpu`` (an H100
is where they last passed: docs/gpu.md, "Status").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.ipc.cuda import cuda_device_count

GPU_MODELS = Path(__file__).parent / "models"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs cupy and a CUDA device")
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(skip)
