"""Exceptions shared by the IPC modules."""

from __future__ import annotations


class PeerGone(ConnectionError):
    """The process at the other end of a channel or socket died or closed it.

    Fatal for the channel: the supervisor fails the requests that instance held and restarts it;
    a stub exits.
    """


# The two below subclass built-in exceptions other than Exception, which mypyc cannot compile
# into a native class: they live here, in a module that stays interpreted.
class RingCorrupted(RuntimeError):
    """A length word makes no sense: the peer wrote garbage into the control segment (fatal)."""


class UnknownSegmentError(KeyError):
    """A block names a segment this process was never told about, or one its owner retired
    (a protocol error: the owner retires only segments that hold no block)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown segment"
