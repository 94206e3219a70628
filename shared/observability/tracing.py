"""W3C trace context across the fleet's hops, and spans exported over OTLP when asked.

Every request carries a ``traceparent`` (https://www.w3.org/TR/trace-context/): taken from the
client's HTTP request or started at the gateway, sent in the NATS headers of each message a hop
publishes for it (JetStream keeps headers, so bulk batches carry their job's), and answered in the
HTTP response. A process given ``--otlp-endpoint`` records a span per stage through the
OpenTelemetry SDK (the optional extra ``embedfleet[tracing]``) and exports them in batches from a
thread of its own; without it nothing is recorded and the context is only passed on: a header
parsed, a span id drawn, a header written.

The context of the request being handled lives in a context variable, so log lines carry its trace
and request ids (``embedfleet.shared.observability.logs``) and the NATS client sends it on without every call passing it.
"""

from __future__ import annotations

import argparse
import contextvars
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.registry import default

log = logging.getLogger("embedfleet.tracing")

TRACEPARENT = "traceparent"
# version-traceid-parentid-flags between optional spaces or tabs (HTTP's); a later version may append
# fields after a dash (the spec's rule). The grammar is that of OpenTelemetry's
# TraceContextTextMapPropagator, which tests/shared/observability/test_tracing_propagator.py holds this parser to on a
# table of valid and malformed values. It is parsed here rather than through the propagator: every
# request at the gateway and every message at each hop parses one, and the propagator (a Context, a
# NonRecordingSpan and a SpanContext a header) takes 4 to 5 times as long to read one and about 9 times
# as long to write one (timeit, CPython 3.11: 6.5-7.4 against 1.4-1.8 us; 3.1-3.6 against 0.3-0.4 us).
_HEADER = re.compile(r"^[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:(-.*)|[ \t]*)$")
_MAX_HEADER = 512  # a traceparent is 55 characters; anything far longer is refused unread
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
SAMPLED = 0x01
HEADER_BYTES = 96  # what a traceparent adds to a NATS message ("NATS/1.0", the header line, CRLFs)


@dataclass(frozen=True, slots=True)
class TraceContext:
    """One span's place in a trace: what a ``traceparent`` header holds."""

    trace_id: str  # 32 lowercase hex digits, not all zero
    span_id: str  # 16 lowercase hex digits, not all zero
    flags: int = 0  # bit 0: the trace is sampled (recorded somewhere)

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)

    @property
    def header(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"

    def child(self) -> TraceContext:
        """A new span of the same trace."""
        return TraceContext(self.trace_id, _span_id(), self.flags)

    @classmethod
    def start(cls, sampled: bool) -> TraceContext:
        """The first span of a new trace."""
        return cls(os.urandom(16).hex(), _span_id(), SAMPLED if sampled else 0)

    @classmethod
    def parse(cls, value: str | None) -> TraceContext | None:
        """The context a ``traceparent`` value names; None for a missing or malformed one (the spec:
        a receiver that cannot parse it starts a new trace)."""
        if not value or len(value) > _MAX_HEADER:
            return None
        m = _HEADER.match(value)
        if m is None:
            return None
        version, trace_id, span_id, flags, rest = m.groups()
        if version == "ff" or (version == "00" and rest) or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
            return None
        return cls(trace_id, span_id, int(flags, 16))


def _span_id() -> str:
    while True:
        span = os.urandom(8).hex()
        if span != _ZERO_SPAN:
            return span


def from_headers(headers: Mapping[str, str] | None) -> TraceContext | None:
    """The context in a NATS message's headers (untrusted: parsed strictly, None when absent or bad)."""
    if not headers:
        return None
    return TraceContext.parse(headers.get(TRACEPARENT))


def headers_for(context: TraceContext | None, extra: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """NATS headers that carry ``context`` (with ``extra``); None when there is nothing to send."""
    if context is None:
        return dict(extra) if extra else None
    return {**(extra or {}), TRACEPARENT: context.header}


# -- the request being handled ----------------------------------------------------------------

_CURRENT: contextvars.ContextVar[TraceContext | None] = contextvars.ContextVar("embedfleet_trace", default=None)
_REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("embedfleet_request", default="")


def current() -> TraceContext | None:
    """The context of the span being handled in this task (what a publish made now sends on)."""
    return _CURRENT.get()


def current_request() -> str:
    return _REQUEST.get()


def bind(context: TraceContext | None, request_id: str | None = None) -> None:
    """Make ``context`` (and ``request_id``) the current task's: asyncio gives every task, and so every
    message callback nats-py runs, a copy of the context, so this never leaks to other requests."""
    _CURRENT.set(context)
    if request_id is not None:
        _REQUEST.set(request_id)


# -- configuration ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TracingConfig:
    endpoint: str | None = default("otlp_endpoint")
    sample_ratio: float = default("trace_sample_ratio")

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ConfigError(f"--trace-sample-ratio {self.sample_ratio}: must be in 0..1")
        if self.endpoint is not None and not re.match(r"^https?://[^/\s]+", self.endpoint):
            raise ConfigError(f"--otlp-endpoint {self.endpoint!r}: give an http:// or https:// URL (OTLP over HTTP)")

    @property
    def traces_url(self) -> str | None:
        if self.endpoint is None:
            return None
        url = self.endpoint.rstrip("/")
        return url if url.endswith("/v1/traces") else f"{url}/v1/traces"

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> TracingConfig:
        cfg = cls(getattr(ns, "otlp_endpoint", None), getattr(ns, "trace_sample_ratio", default("trace_sample_ratio")))
        if cfg.endpoint is not None:
            _sdk()  # fail at start, naming the extra, rather than at the first span
        return cfg


def _sdk():
    try:
        from opentelemetry import trace as otel
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError:
        raise ConfigError("--otlp-endpoint needs the OpenTelemetry SDK: pip install 'embedfleet[tracing]'") from None
    return otel, OTLPSpanExporter, Resource, TracerProvider, BatchSpanProcessor, ParentBased, TraceIdRatioBased


# -- spans --------------------------------------------------------------------------------------


def _attribute(key: str) -> str:
    """embedfleet's own attributes under its namespace; dotted names (OpenTelemetry's conventions) as given."""
    return key if "." in key else f"embedfleet.{key}"


class Span:
    """A stage of a request. ``context`` is what the stage sends on; ``set`` adds attributes, which
    cost nothing when the span is not recorded."""

    __slots__ = ("context", "_span")

    def __init__(self, context: TraceContext, span: Any = None) -> None:
        self.context = context
        self._span = span

    @property
    def recording(self) -> bool:
        return self._span is not None

    def set(self, **attributes: Any) -> None:
        if self._span is not None:
            self._span.set_attributes({_attribute(key): value for key, value in attributes.items()})

    def error(self, code: str, message: str) -> None:
        if self._span is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_attribute("embedfleet.error_code", code)
            self._span.set_status(Status(StatusCode.ERROR, message[:256]))

    def end(self, end_ns: int | None = None) -> None:
        if self._span is not None:
            self._span.end(end_time=end_ns)
            self._span = None

    def __enter__(self) -> Span:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if exc is not None and self._span is not None and not isinstance(exc, GeneratorExit):
            self.error(getattr(getattr(exc, "code", None), "value", type(exc).__name__), str(exc))
        self.end()


class Tracer:
    """One process's spans. Without an endpoint it records nothing: ``start`` draws a span id."""

    def __init__(self, service: str, cfg: TracingConfig = TracingConfig()) -> None:
        self._provider = None
        self._tracer = None
        self._otel = None
        if cfg.endpoint is not None:
            otel, exporter, resource, provider_type, processor, parent_based, ratio = _sdk()
            self._otel = otel
            self._provider = provider_type(
                resource=resource.create({"service.name": f"embedfleet-{service}", "service.namespace": "embedfleet"}),
                sampler=parent_based(ratio(cfg.sample_ratio)),
            )
            self._provider.add_span_processor(processor(exporter(endpoint=cfg.traces_url)))
            self._tracer = self._provider.get_tracer("embedfleet")
            log.info("exporting spans to %s (sample ratio %g)", cfg.traces_url, cfg.sample_ratio)

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def start(
        self,
        name: str,
        parent: TraceContext | None,
        kind: str = "internal",
        start_ns: int | None = None,
        **attributes: Any,
    ) -> Span:
        """A span of ``name`` under ``parent`` (None: the first of a new trace)."""
        if self._tracer is None:
            if parent is None:
                return Span(TraceContext.start(sampled=False))
            return Span(parent.child())
        otel = self._otel
        assert otel is not None  # loaded with the tracer
        context = None
        if parent is not None:
            remote = otel.SpanContext(
                int(parent.trace_id, 16),
                int(parent.span_id, 16),
                is_remote=True,
                trace_flags=otel.TraceFlags(parent.flags & 0xFF),
            )
            context = otel.set_span_in_context(otel.NonRecordingSpan(remote))
        span = self._tracer.start_span(
            name,
            context=context,
            kind=getattr(otel.SpanKind, kind.upper()),
            start_time=start_ns,
            attributes={_attribute(k): v for k, v in attributes.items()} or None,
        )
        sc = span.get_span_context()
        made = TraceContext(f"{sc.trace_id:032x}", f"{sc.span_id:016x}", int(sc.trace_flags))
        return Span(made, span if span.is_recording() else None)

    def record(self, name: str, parent: TraceContext | None, start_ns: int, end_ns: int, **attributes: Any) -> None:
        """A span measured already (a wait in a queue, a forward pass): started and ended at once."""
        if self._tracer is not None and parent is not None and parent.sampled:
            self.start(name, parent, start_ns=start_ns, **attributes).end(end_ns)

    def shutdown(self) -> None:
        """Export what is buffered, then stop the exporter's thread."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None
            self._tracer = None


def wall_ns(perf_seconds: float, now_perf: float | None = None, now_ns: int | None = None) -> int:
    """The wall-clock time, in ns since the epoch, of an instant ``time.perf_counter()`` gave as
    ``perf_seconds`` (spans take wall-clock times; stages are timed with the monotonic counter)."""
    now_perf = time.perf_counter() if now_perf is None else now_perf
    now_ns = time.time_ns() if now_ns is None else now_ns
    return now_ns - int((now_perf - perf_seconds) * 1e9)
