"""Frontend worker processes (``shoal serve --frontend-workers N``) and their client of the core.

``client``: :class:`~shoal.frontends.workers.client.RemoteCore`, the core API over IPC, which the
HTTP and gRPC frontends use in a worker as they use the service in the core. ``host``: the core's
side, which spawns the workers, answers their calls and restarts them. ``_wire``: the records.
"""
