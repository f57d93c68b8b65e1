"""Let the server hold as many connections as the system allows it.

Many systems start a service with a soft ``RLIMIT_NOFILE`` of 1024 (systemd's default) under a
much higher hard limit. Every client connection is a descriptor, in the core with one frontend
or in a worker, so 1024 would refuse the 1025th connection (or a stub's restart needing a
socket) while the operator's hard limit allows far more. The soft limit is raised to the hard
one at start, as Go's runtime does for every program; an operator who wants less sets the hard
limit (``ulimit -Hn``, systemd's ``LimitNOFILE=``). The stubs and workers inherit it. shoal
never hands a descriptor to ``select()``, which cannot take numbers past 1024
(``ipc.fdpass.readable_now`` polls).
"""

from __future__ import annotations

import resource

__all__ = ["raise_open_file_limit"]

#: Enough for any server; an unlimited hard limit is not copied as is (some code sizes tables
#: by the limit).
_CEILING = 1 << 20


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft limit of open files to the hard one (at most 2^20); (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _CEILING if hard == resource.RLIM_INFINITY else min(hard, _CEILING)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, target
    return soft, soft
