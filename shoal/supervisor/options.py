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
    #: ``--frontend-workers``: processes serving HTTP and gRPC around the core; 1 serves them in
    #: the core's own process (no hop). The command line's default is ``auto`` (1 on two cores).
    frontend_workers: int = 1
    #: ``--direct-dispatch``: with workers, plain requests go straight to the stubs.
    direct_dispatch: bool = True
    #: ``--busy-poll-us``: how long the core's and the workers' loops poll for an answer after
    #: sending work out (``shoal.ipc.busy_poll``); 0 never, -1 ``auto`` (where cores are spare).
    busy_poll_us: float = 0.0
    #: Poll only while the machine has idle cores (``auto`` without a core to spare).
    busy_poll_when_idle: bool = False
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    #: How long a polled gauge (a stub's RSS) is reused before it is read again.
    metrics_interval_ms: int = 2000
    allow_cpu_metrics: bool = True
    #: ``--metrics-config counter_latencies``: export the nv_inference_*_duration_us counters.
    counter_latencies: bool = True
    #: ``--metrics-config summary_latencies`` / ``histogram_latencies``: Triton's latency
    #: summaries and first-response histogram (off by default, as in Triton).
    summary_latencies: bool = False
    histogram_latencies: bool = False
    #: ``--metrics-config summary_quantiles``: (quantile, error) pairs; () is Triton's default.
    summary_quantiles: tuple[tuple[float, float], ...] = ()
    #: ``--allow-client-shm``: clients may register and unregister shared-memory regions.
    allow_client_shm: bool = True
    #: ``--id``: the server's name in its metadata.
    server_id: str = "triton"
    model_control_mode: str = "none"
    repository_poll_secs: float = 15.0
    load_models: tuple[str, ...] = ()
    strict_model_config: bool = False
    #: ``--model-config-name``: read ``<model>/configs/<name>.pbtxt`` where it exists.
    model_config_name: str = ""
    #: ``--model-load-retry-count``: further attempts after a model failed to load.
    model_load_retry_count: int = 0
    #: ``--model-load-thread-count``: versions of the repository's models started at once.
    model_load_thread_count: int = 4
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
    #: ``--reuse-*-port``: listen with SO_REUSEPORT, beside other servers on the same port.
    reuse_http_port: bool = False
    reuse_grpc_port: bool = False
    #: ``--*-header-forward-pattern``: headers (metadata) whose names match become request
    #: parameters ("" forwards none).
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    http_restricted_api: tuple[Restriction, ...] = ()
    grpc_restricted_protocol: tuple[Restriction, ...] = ()
    http_max_input_size: int = 64 * MIB
    #: A request head's size limit and read timeouts (docs/hardening.md, "Connections").
    http_max_header_size: int = 32 * 1024
    http_header_timeout_secs: float = 60.0
    http_body_timeout_secs: float = 60.0
    http_send_timeout_secs: float = 60.0
    #: gRPC: the message size limit (Triton's fixed INT32_MAX) and HTTP/2 flood limits: the
    #: ping policy of grpc-core under Triton's flags, then nghttp2's defaults.
    grpc_max_message_size: int = 2**31 - 1
    grpc_max_connection_buffer_size: int = 2**31 - 1
    grpc_http2_max_ping_strikes: int = 2
    grpc_http2_min_recv_ping_interval_without_data: int = 300_000
    grpc_keepalive_permit_without_calls: bool = False
    grpc_http2_max_queued_control_frames: int = 1000
    grpc_http2_stream_reset_burst: int = 1000
    grpc_http2_stream_reset_rate: float = 33.0
    grpc_http2_max_empty_frames: int = 1000
    grpc_read_timeout_secs: float = 60.0
    #: How long an answer may wait for a client that takes none of it, and how many answer
    #: bytes one connection may hold waiting (docs/hardening.md, "gRPC answers").
    grpc_send_timeout_secs: float = 60.0
    grpc_max_connection_send_buffer_size: int = 1 << 30
    #: Triton's keepalive and connection age flags, in milliseconds (age 0: none).
    grpc_keepalive_time: int = 7_200_000
    grpc_keepalive_timeout: int = 20_000
    grpc_http2_max_pings_without_data: int = 2
    grpc_max_connection_age: int = 0
    grpc_max_connection_age_grace: int = 0
    grpc_infer_response_compression_level: str = "none"
    arenas: ArenaOptions = field(default_factory=ArenaOptions)
    backend_config: tuple[tuple[str, str, str], ...] = ()
    #: ``--backend-directory``: where Python-based backends live (``<dir>/<name>/model.py``).
    backend_directory: str = "/opt/tritonserver/backends"
    #: ``--cuda-memory-pool-byte-size``: the limit of each device's CUDA pool, by device.
    cuda_pool_limits: tuple[tuple[int, int], ...] = ()
    #: ``--trace-config``: the global trace settings at start (trace_level, trace_file, ...).
    trace_settings: tuple[tuple[str, str | tuple[str, ...]], ...] = ()
    #: ``--cache-config local,size=N``: the response cache's size in bytes (0: no cache).
    cache_bytes: int = 0
    #: ``--rate-limit``: "off" or "execution_count".
    rate_limit: str = "off"
    #: ``--rate-limit-resource``: ((name, device or None for every device), count) pairs.
    rate_limit_resources: tuple[tuple[tuple[str, int | None], int], ...] = ()
