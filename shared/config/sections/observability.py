"""Options of metrics and tracing: the Prometheus port and host, the OTLP endpoint, the share of traces kept."""

from __future__ import annotations

from embedfleet.shared.config.commands import METRICS, TRACED
from embedfleet.shared.config.option import Option, declare, port_number

OPTIONS: tuple[Option, ...] = (
    declare(
        "--metrics-port",
        "EMBEDFLEET_METRICS_PORT",
        0,
        "port serving Prometheus metrics at /metrics; 0: none (the gateway serves them on its HTTP port too; "
        "embedfleet up gives every service a free port and prints the URLs)",
        METRICS,
        "metrics",
        type=port_number,
    ),
    declare(
        "--metrics-host",
        "EMBEDFLEET_METRICS_HOST",
        "127.0.0.1",
        "address the metrics port listens on (0.0.0.0: every interface, for a Prometheus on another machine)",
        METRICS,
        "metrics",
    ),
    declare(
        "--otlp-endpoint",
        "EMBEDFLEET_OTLP_ENDPOINT",
        None,
        "OpenTelemetry collector to export spans to over OTLP/HTTP (http://HOST:4318; /v1/traces is added); "
        "unset: no spans are recorded, the trace context is only passed on (needs embedfleet[tracing])",
        TRACED,
        "tracing",
    ),
    declare(
        "--trace-sample-ratio",
        "EMBEDFLEET_TRACE_SAMPLE_RATIO",
        0.1,
        "share of the traces started here that are recorded, 0..1 (1: all; a request that brings a traceparent follows its "
        "sampled flag)",
        TRACED,
        "tracing",
        type=float,
    ),
)
