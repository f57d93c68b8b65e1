"""The one error of remote model repositories."""

from __future__ import annotations


class RemoteRepositoryError(OSError):
    """A remote model repository cannot be parsed, reached, listed or downloaded.

    Fatal at start-up (the CLI exits non-zero with the message, which names the URL); during a poll
    it is logged and the models already loaded keep serving; on an explicit load it fails that load.
    """
