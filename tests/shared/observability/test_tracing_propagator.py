"""shared/observability/tracing.py's traceparent parser against OpenTelemetry's TraceContextTextMapPropagator (the
extra ``tracing``): the same context, or the same refusal, for every value of a table of valid and
malformed headers, and the same header written back."""

from __future__ import annotations

import pytest

from embedfleet.shared.observability.tracing import TraceContext

propagation = pytest.importorskip("opentelemetry.trace.propagation.tracecontext")
from opentelemetry import trace  # noqa: E402  (after the skip: the extra may be missing)

PROPAGATOR = propagation.TraceContextTextMapPropagator()
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
HEADER = f"00-{TRACE}-{SPAN}-01"

VALID = [
    HEADER,
    f"00-{TRACE}-{SPAN}-00",
    f"00-{TRACE}-{SPAN}-ff",  # flags the spec has no meaning for yet are kept
    f"  00-{TRACE}-{SPAN}-01 ",
    f"\t00-{TRACE}-{SPAN}-01\t",
    f"00-{TRACE}-{SPAN}-01\n",  # a final newline passes both ($ matches before it); no header carries one
    f"01-{TRACE}-{SPAN}-03",
    f"01-{TRACE}-{SPAN}-03-what-comes-next",  # a later version's fields after the first four are skipped
    f"fe-{TRACE}-{SPAN}-01-",
    f"cc-{TRACE}-{SPAN}-01-é and \x01",  # whatever they hold
    f"01-{TRACE}-{SPAN}-01-" + "x" * (512 - 56),  # 512 characters: the longest read
]
INVALID = [
    None,
    "",
    " ",
    "garbage",
    f"01-{TRACE}-{SPAN}-01-" + "x" * (513 - 56),  # one past the longest read
    f"00-{TRACE}-{SPAN}-01" + "-x" * 400,
    f"00-{TRACE.upper()}-{SPAN}-01",  # hex digits are lower case
    f"00-{TRACE}-{SPAN.upper()}-01",
    f"00-{TRACE}-{SPAN}-0A",
    f"00-{'0' * 32}-{SPAN}-01",  # all-zero ids
    f"00-{TRACE}-{'0' * 16}-01",
    f"ff-{TRACE}-{SPAN}-01",  # version ff is forbidden
    f"00-{TRACE}-{SPAN}-01-extra",  # version 00 has exactly four fields
    f"00-{TRACE}-{SPAN}-01-",
    f"00-{TRACE[:-1]}-{SPAN}-01",
    f"00-{TRACE}0-{SPAN}-01",
    f"00-{TRACE}-{SPAN[:-1]}-01",
    f"00-{TRACE}-{SPAN}-1",
    f"0-{TRACE}-{SPAN}-01",
    f"00-{TRACE}-{SPAN}-01x",
    f"00_{TRACE}_{SPAN}_01",
    f"0g-{TRACE}-{SPAN}-01",
    f"00-{TRACE[:-1]}g-{SPAN}-01",
    f"\r00-{TRACE}-{SPAN}-01",  # around it: spaces and tabs only
    f"00-{TRACE}-{SPAN}-01\r\n",
    f"\n00-{TRACE}-{SPAN}-01",
    f"\u00a000-{TRACE}-{SPAN}-01",
    f"00-{TRACE}-{SPAN}-01\n-x",
    f"{HEADER},{HEADER}",  # two headers folded into one value
]


def otel_parse(value: str | None) -> TraceContext | None:
    carrier = {} if value is None else {"traceparent": value}
    found = trace.get_current_span(PROPAGATOR.extract(carrier)).get_span_context()
    if not found.is_valid:
        return None
    return TraceContext(
        trace.format_trace_id(found.trace_id), trace.format_span_id(found.span_id), int(found.trace_flags)
    )


def otel_header(context: TraceContext) -> str:
    span = trace.SpanContext(
        int(context.trace_id, 16),
        int(context.span_id, 16),
        is_remote=False,
        trace_flags=trace.TraceFlags(context.flags),
    )
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier, trace.set_span_in_context(trace.NonRecordingSpan(span)))
    return carrier["traceparent"]


@pytest.mark.parametrize("value", VALID)
def test_a_valid_header_gives_the_propagators_context(value):
    context = TraceContext.parse(value)
    assert context is not None and context.trace_id == TRACE and context.span_id == SPAN
    assert context == otel_parse(value)
    assert context.header == otel_header(context)  # and is written back as the propagator writes it


@pytest.mark.parametrize("value", INVALID)
def test_a_malformed_header_is_refused_as_the_propagator_refuses_it(value):
    assert TraceContext.parse(value) is None
    assert otel_parse(value) is None
