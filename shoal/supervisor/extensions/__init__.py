"""Triton's protocol extensions the core serves, and what server metadata lists of them."""

#: The ``extensions`` of the server metadata: what this server supports.
EXTENSIONS = (
    "binary_tensor_data",
    "model_configuration",
    "model_repository",
    "model_repository(unload_dependents)",
    "parameters",
    "statistics",
    "system_shared_memory",
    "cuda_shared_memory",
    "logging",
    "trace",
    "generate",
    "classification",
    "sequence",
    "schedule_policy",
)
