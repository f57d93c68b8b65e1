"""Exceptions shared by the IPC modules."""

from __future__ import annotations


class PeerGone(ConnectionError):
    """The process at the other end of a channel or socket died or closed it.

    Fatal for the channel: the supervisor fails the requests that instance held and restarts it;
    a stub exits.
    """
