"""Server options: one frozen object built by the CLI from tritonserver-style flags."""

from __future__ import annotations

from dataclasses import dataclass, field

MIB = 1 << 20


@dataclass(frozen=True)
class ArenaOptions:
    """Shared-memory sizes (Triton's ``--backend-config=python,shm-*`` knobs map here)."""

    input_initial_bytes: int = 64 * MIB
    output_initial_bytes: int = 16 * MIB
    growth_bytes: int = 64 * MIB
    limit_bytes: int = 4096 * MIB


@dataclass(frozen=True)
class Restriction:
    """One ``--http-restricted-api`` / ``--grpc-restricted-protocol`` group: calls to ``apis``
    must carry ``key`` (an HTTP header; on gRPC the metadata key ``triton-grpc-protocol-<key>``)
    set to ``value``."""

    apis: tuple[str, ...]
    key: str
    value: str


@dataclass(frozen=True)
class ServerOptions:
    model_repositories: tuple[str, ...]
    #: Where remote (s3://, gs://, az://) repositories are mirrored; "" is a temporary directory.
    model_repository_cache: str = ""
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    #: "native" (shoal's HTTP/2 server on the event loop) or "grpcio" (grpc.aio).
    grpc_server: str = "native"
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    #: How long a polled gauge (a stub's RSS) is reused before it is read again.
    metrics_interval_ms: int = 2000
    allow_cpu_metrics: bool = True
    model_control_mode: str = "none"
    repository_poll_secs: float = 15.0
    load_models: tuple[str, ...] = ()
    strict_model_config: bool = False
    strict_readiness: bool = True
    exit_on_error: bool = True
    exit_timeout_secs: float = 30.0
    #: Record the time each request spends in each stage of the pipeline (docs/perf.md).
    trace_overhead: bool = False
    log_verbose: int = 0
    #: Where server log lines (and the stubs' output) go; "" is stderr.
    log_file: str = ""
    #: Triton's timestamp styles: "default" (``I0215 21:04:11.572305``) or "ISO8601".
    log_format: str = "default"
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    http_restricted_api: tuple[Restriction, ...] = ()
    grpc_restricted_protocol: tuple[Restriction, ...] = ()
    http_max_input_size: int = 64 * MIB
    arenas: ArenaOptions = field(default_factory=ArenaOptions)
    backend_config: tuple[tuple[str, str, str], ...] = ()
    #: ``--cuda-memory-pool-byte-size``: the limit of each device's CUDA pool, by device.
    cuda_pool_limits: tuple[tuple[int, int], ...] = ()
