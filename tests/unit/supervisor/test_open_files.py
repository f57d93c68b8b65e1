"""The server raises its soft limit of open files to the hard one at start."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

#: Run in a child: the limits are the process's own.
_CHILD = """
import json, resource
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
from shoal.supervisor.open_files import raise_open_file_limit
changed = raise_open_file_limit()
print(json.dumps([changed, resource.getrlimit(resource.RLIMIT_NOFILE)]))
"""


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard limit is {hard}")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True
    ).stdout
    (before, after), (soft, now_hard) = json.loads(out)
    expected = (1 << 20) if hard == resource.RLIM_INFINITY else min(hard, 1 << 20)
    assert (before, after) == (256, expected)
    assert (soft, now_hard) == (expected, hard)
