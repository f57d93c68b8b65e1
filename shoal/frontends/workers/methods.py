"""The core API's methods a frontend worker may call by name, and how each travels."""

from __future__ import annotations

#: The core API's asynchronous methods, other than inference, a worker may call by name.
ASYNC_METHODS: frozenset[str] = frozenset(
    {"load_model", "unload_model", "model_ready_now", "model_decoupled"}
)

#: The direct dispatch calls a worker makes on its control socket (``host._Link``).
DIRECT_METHODS: frozenset[str] = frozenset({"direct_route", "direct_segment", "direct_inputs"})

#: The core API's synchronous methods a worker may call, by name.
SYNC_METHODS: frozenset[str] = frozenset(
    {
        "is_live",
        "is_ready",
        "server_metadata",
        "model_ready",
        "model_metadata",
        "model_config",
        "model_statistics",
        "repository_index",
        "register_system_shm",
        "unregister_system_shm",
        "system_shm_status",
        "register_cuda_shm",
        "unregister_cuda_shm",
        "cuda_shm_status",
        "log_settings",
        "update_log_settings",
        "packing_summary",
        "trace_settings",
        "update_trace_settings",
    }
)
