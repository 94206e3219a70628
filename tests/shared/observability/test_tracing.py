"""W3C trace context parsing, spans exported over real OTLP/HTTP to a local receiver, and log lines
that carry the handled request's ids."""

from __future__ import annotations

import io
import json
import logging

import pytest

from bench.otlp_sink import OtlpSink
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.observability.logs import JsonFormatter, TextFormatter, _RequestIds
from embedfleet.shared.observability.tracing import (
    HEADER_BYTES,
    TraceContext,
    Tracer,
    TracingConfig,
    bind,
    current,
    from_headers,
    headers_for,
    wall_ns,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


@pytest.mark.parametrize(
    "value, want",
    [
        (f"00-{TRACE}-{SPAN}-01", TraceContext(TRACE, SPAN, 1)),
        (f"00-{TRACE}-{SPAN}-00", TraceContext(TRACE, SPAN, 0)),
        # a later version may append fields: the first four are read (the spec's forward compatibility)
        (f"01-{TRACE}-{SPAN}-03-what-comes-next", TraceContext(TRACE, SPAN, 3)),
        (f"  00-{TRACE}-{SPAN}-01 ", TraceContext(TRACE, SPAN, 1)),
    ],
)
def test_a_valid_traceparent_parses(value, want):
    assert TraceContext.parse(value) == want


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        f"00-{TRACE.upper()}-{SPAN}-01",  # upper case is invalid
        f"00-{'0' * 32}-{SPAN}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero span id
        f"ff-{TRACE}-{SPAN}-01",  # version ff is forbidden
        f"00-{TRACE}-{SPAN}-01-extra",  # version 00 has exactly four fields
        f"00-{TRACE[:-1]}-{SPAN}-01",
        f"00-{TRACE}-{SPAN}-1",
        f"00-{TRACE}-{SPAN}-01" + "-x" * 400,  # far longer than any traceparent: refused unread
    ],
)
def test_a_malformed_traceparent_is_refused(value):
    assert TraceContext.parse(value) is None


def test_header_round_trip_and_children():
    ctx = TraceContext(TRACE, SPAN, 1)
    assert ctx.header == f"00-{TRACE}-{SPAN}-01" and TraceContext.parse(ctx.header) == ctx
    child = ctx.child()
    assert child.trace_id == TRACE and child.flags == 1 and child.span_id != SPAN and len(child.span_id) == 16
    fresh = TraceContext.start(sampled=True)
    assert fresh.sampled and len(fresh.trace_id) == 32 and fresh.trace_id != TRACE
    assert not TraceContext.start(sampled=False).sampled


def test_nats_headers_carry_the_context():
    ctx = TraceContext(TRACE, SPAN, 1)
    headers = headers_for(ctx, {"Nats-Msg-Id": "job:1"})
    assert headers == {"Nats-Msg-Id": "job:1", "traceparent": ctx.header}
    assert from_headers(headers) == ctx
    assert headers_for(None) is None and from_headers(None) is None and from_headers({"traceparent": "bad"}) is None
    # the room the client keeps for it covers the header block nats-py writes
    block = b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers_for(ctx).items()) + b"\r\n"
    assert len(block) <= HEADER_BYTES


def test_without_an_endpoint_nothing_is_recorded_and_the_context_is_passed_on():
    tracer = Tracer("test")
    assert not tracer.enabled
    parent = TraceContext(TRACE, SPAN, 1)
    with tracer.start("stage", parent) as span:
        assert span.context.trace_id == TRACE and span.context.span_id != SPAN and not span.recording
    root = tracer.start("root", None).context
    assert root.trace_id != TRACE and not root.sampled  # nothing here records it


def test_config_checks_its_values():
    assert TracingConfig("http://collector:4318").traces_url == "http://collector:4318/v1/traces"
    assert TracingConfig("http://c:4318/v1/traces/").traces_url == "http://c:4318/v1/traces"
    assert TracingConfig().traces_url is None
    with pytest.raises(ConfigError, match=r"--trace-sample-ratio 1.5"):
        TracingConfig(sample_ratio=1.5)
    with pytest.raises(ConfigError, match="--otlp-endpoint 'collector:4318'"):
        TracingConfig("collector:4318")


@pytest.fixture
def sink():
    s = OtlpSink().start()
    yield s
    s.close()


def test_spans_reach_an_otlp_receiver_with_their_parents(sink):
    tracer = Tracer("unit", TracingConfig(sink.url))
    parent = TraceContext(TRACE, SPAN, 1)
    with tracer.start("outer", parent, "server", request_id="r1") as outer:
        outer.set(**{"http.route": "/embed"}, tokens=7)
        tracer.record("queue", outer.context, 1_000, 2_000)
    with tracer.start("failing", parent) as failing:
        failing.error("timeout", "deadline passed")
    tracer.shutdown()  # exports what is buffered
    spans = {s.name: s for s in sink.spans(TRACE)}
    assert set(spans) == {"outer", "queue", "failing"}
    assert spans["outer"].parent_id == SPAN and spans["outer"].kind == "server"
    assert spans["outer"].service == "embedfleet-unit" and spans["outer"].span_id == outer.context.span_id
    assert spans["outer"].attributes == {"embedfleet.request_id": "r1", "http.route": "/embed", "embedfleet.tokens": 7}
    assert spans["queue"].parent_id == outer.context.span_id and (spans["queue"].start_ns, spans["queue"].end_ns) == (
        1_000,
        2_000,
    )
    assert spans["failing"].error and spans["failing"].attributes["embedfleet.error_code"] == "timeout"
    assert not spans["outer"].error


def test_unsampled_parents_and_a_zero_ratio_record_nothing(sink):
    tracer = Tracer("unit", TracingConfig(sink.url, sample_ratio=0.0))
    unsampled = TraceContext(TRACE, SPAN, 0)
    span = tracer.start("not recorded", unsampled)
    assert span.context.trace_id == TRACE and not span.context.sampled and not span.recording
    span.end()
    root = tracer.start("a root under ratio 0", None)
    assert not root.context.sampled
    root.end()
    sampled = tracer.start("recorded: its parent is sampled", TraceContext(TRACE, SPAN, 1))
    sampled.end()
    tracer.shutdown()
    assert [s.name for s in sink.spans()] == ["recorded: its parent is sampled"]


def test_by_default_one_trace_in_ten_is_recorded(sink):
    """Recording every trace costs ~11% more CPU on single queries: the default records a tenth."""
    tracer = Tracer("unit", TracingConfig(sink.url))
    roots = [tracer.start("root", None) for _ in range(2000)]
    assert all(span.recording == span.context.sampled for span in roots)
    for span in roots:
        span.end()
    recorded = sum(span.context.sampled for span in roots)
    assert 140 <= recorded <= 260  # 200 expected; 4.5 standard deviations either side
    tracer.shutdown()


def test_wall_clock_of_a_perf_counter_instant():
    assert wall_ns(9.5, now_perf=10.0, now_ns=5_000_000_000) == 4_500_000_000


def _record(fmt: logging.Formatter) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(fmt)
    handler.addFilter(_RequestIds())
    logger = logging.getLogger("embedfleet.test-logs")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("answered %d rows", 3)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue().strip()


def test_log_lines_carry_the_request_and_trace_ids():
    bind(TraceContext(TRACE, SPAN, 1), "req-42")
    try:
        line = json.loads(_record(JsonFormatter("gateway")))
        text = _record(TextFormatter("gateway"))
    finally:
        bind(None, "")
    assert line["message"] == "answered 3 rows" and line["level"] == "warning" and line["service"] == "gateway"
    assert (line["request_id"], line["trace_id"], line["span_id"]) == ("req-42", TRACE, SPAN)
    assert line["time"].endswith("Z") and line["logger"] == "embedfleet.test-logs"
    assert text.endswith(f"answered 3 rows [request=req-42 trace={TRACE}]")
    assert current() is None
    # with nothing bound, no ids
    assert "trace_id" not in json.loads(_record(JsonFormatter("gateway"))) and _record(TextFormatter("x")).endswith(
        "rows"
    )
