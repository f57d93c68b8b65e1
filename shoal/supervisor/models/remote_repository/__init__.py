"""Model repositories in object stores (``s3://``, ``gs://``, ``az://``), mirrored to a local
cache that the repository manager scans like any local repository.

One interface: :class:`RepositorySources` turns the ``--model-repository`` locations into local
directories, and its ``sync()`` brings the remote ones up to date, returning which models changed.
The back-ends (fsspec with s3fs, gcsfs or adlfs) are imported only when a remote URL is used.
"""

from shoal.supervisor.models.remote_repository._errors import RemoteRepositoryError
from shoal.supervisor.models.remote_repository._listing import Changes
from shoal.supervisor.models.remote_repository._location import (
    RemoteLocation,
    is_remote,
    parse_location,
)
from shoal.supervisor.models.remote_repository._sources import RepositorySources

__all__ = [
    "Changes",
    "RemoteLocation",
    "RemoteRepositoryError",
    "RepositorySources",
    "is_remote",
    "parse_location",
]
