"""Traces across the NATS hops, on real processes exporting over OTLP/HTTP to a local receiver: the
client's traceparent continues through gateway, tokenizer, worker and scorer (and a bulk job's stages),
each stage a span whose parent is the hop before it; every answer carries the trace context; log
lines in JSON carry the request's trace id."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import httpx
import pytest

from bench.otlp_sink import OtlpSink, ReceivedSpan
from embedfleet.shared.observability.tracing import TraceContext
from tests.support.corpus import mixed_texts
from tests.support.procs import Service, count_services, healthy, wait_until

pytestmark = pytest.mark.integration

PREFIX = "tracetest"
MODEL = "all-MiniLM-L6-v2"
# the exporters send every 100 ms instead of every 5 s: the test waits for spans, not for a timer
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


class Traced:
    def __init__(self, base_url: str, sink: OtlpSink, services: dict[str, Service]) -> None:
        self.base_url, self.sink, self.services = base_url, sink, services


@pytest.fixture(scope="module")
def traced(nats_url: str, tmp_path_factory) -> Iterator[Traced]:
    log_dir = tmp_path_factory.mktemp("trace-logs")
    sink = OtlpSink().start()
    from embedfleet.services.up.launch import FreePorts

    with contextlib.closing(FreePorts("127.0.0.1")) as free:
        port = free(1)
    common = [
        "--nats",
        nats_url,
        "--subject-prefix",
        PREFIX,
        "--otlp-endpoint",
        sink.url,
        "--trace-sample-ratio",
        "1",
        "--log-format",
        "json",
    ]
    services = {
        "tokenizer": Service("tokenizer", common, log_dir, FAST_EXPORT),
        "worker": Service(
            "worker", [*common, "--max-batch-tokens", "1024"], log_dir, {**FAST_EXPORT, "OMP_NUM_THREADS": "1"}
        ),
        "scorer": Service("scorer", common, log_dir, FAST_EXPORT),
        "gateway": Service("gateway", [*common, "--port", str(port)], log_dir, FAST_EXPORT),
    }
    base_url = f"http://127.0.0.1:{port}"
    procs = list(services.values())
    try:
        wait_until(lambda: healthy(base_url), 180, "gateway health", procs)
        wait_until(lambda: count_services(nats_url, "worker", prefix=PREFIX) == 1, 120, "the worker", procs)
        wait_until(lambda: count_services(nats_url, "scorer", prefix=PREFIX) == 1, 60, "the scorer", procs)
        yield Traced(base_url, sink, services)
    finally:
        for s in procs:
            s.stop()
        sink.close()


def _one(spans: list[ReceivedSpan], service: str, name: str) -> ReceivedSpan:
    found = [s for s in spans if s.service == f"embedfleet-{service}" and s.name == name]
    assert len(found) == 1, f"{service}:{name} x{len(found)} in {[(s.service, s.name) for s in spans]}"
    return found[0]


def _has(*wanted: tuple[str, str]):
    return lambda spans: all(
        any(s.service == f"embedfleet-{svc}" and s.name == name for s in spans) for svc, name in wanted
    )


def test_an_embedding_request_is_one_trace_across_every_hop(traced):
    client = TraceContext.start(sampled=True)
    r = httpx.post(
        f"{traced.base_url}/v1/embeddings",
        json={"model": MODEL, "input": ["a query about tracing", "and another"]},
        headers={"traceparent": client.header},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    answered = TraceContext.parse(r.headers["traceparent"])
    assert answered is not None and answered.trace_id == client.trace_id and answered.span_id != client.span_id
    spans = traced.sink.wait_for(
        client.trace_id,
        _has(
            ("gateway", "POST /v1/embeddings"),
            ("tokenizer", "tokenizer embed"),
            ("worker", "worker embed"),
            ("worker", "queue"),
            ("worker", "inference"),
        ),
    )
    gateway = _one(spans, "gateway", "POST /v1/embeddings")
    tokenizer = _one(spans, "tokenizer", "tokenizer embed")
    worker = _one(spans, "worker", "worker embed")
    assert gateway.parent_id == client.span_id and gateway.span_id == answered.span_id and gateway.kind == "server"
    assert (
        gateway.attributes["http.response.status_code"] == 200 and gateway.attributes["http.route"] == "/v1/embeddings"
    )
    assert tokenizer.parent_id == gateway.span_id and tokenizer.kind == "consumer"
    assert worker.parent_id == tokenizer.span_id and worker.attributes["embedfleet.rows"] == 2
    for stage in ("queue", "inference"):
        child = _one(spans, "worker", stage)
        assert (
            child.parent_id == worker.span_id
            and worker.start_ns <= child.start_ns <= child.end_ns <= worker.end_ns + 1_000_000
        )
    # the stages nest in time: the gateway's span holds the others
    assert gateway.start_ns <= tokenizer.start_ns and worker.end_ns <= gateway.end_ns + 1_000_000
    assert worker.attributes["embedfleet.request_id"] == tokenizer.attributes["embedfleet.request_id"]


def test_a_request_without_trace_context_starts_a_sampled_trace_at_the_gateway(traced):
    r = httpx.post(f"{traced.base_url}/embed", json={"inputs": "no traceparent here"}, timeout=30)
    assert r.status_code == 200, r.text
    started = TraceContext.parse(r.headers["traceparent"])
    assert started is not None and started.sampled
    spans = traced.sink.wait_for(started.trace_id, _has(("gateway", "POST /embed"), ("worker", "worker embed")))
    assert _one(spans, "gateway", "POST /embed").parent_id == ""  # the trace's root


def test_an_unsampled_trace_is_passed_on_but_not_recorded(traced):
    quiet = TraceContext.start(sampled=False)
    r = httpx.post(
        f"{traced.base_url}/embed", json={"inputs": "not sampled"}, headers={"traceparent": quiet.header}, timeout=30
    )
    assert r.status_code == 200
    answered = TraceContext.parse(r.headers["traceparent"])
    assert answered.trace_id == quiet.trace_id and not answered.sampled
    # a sampled request sent after it: once its worker span arrived, the earlier one's would have too
    loud = TraceContext.start(sampled=True)
    httpx.post(f"{traced.base_url}/embed", json={"inputs": "sampled"}, headers={"traceparent": loud.header}, timeout=30)
    traced.sink.wait_for(
        loud.trace_id, _has(("gateway", "POST /embed"), ("tokenizer", "tokenizer embed"), ("worker", "worker embed"))
    )
    assert traced.sink.spans(quiet.trace_id) == []


def test_a_rerank_traces_the_scorer_and_its_trips_through_the_fleet(traced):
    client = TraceContext.start(sampled=True)
    texts = mixed_texts(5)
    r = httpx.post(
        f"{traced.base_url}/rerank",
        json={"query": "what is tracing", "texts": texts},
        headers={"traceparent": client.header},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    spans = traced.sink.wait_for(
        client.trace_id,
        lambda got: (
            _has(("gateway", "POST /rerank"), ("scorer", "scorer rerank"))(got)
            and sum(s.name == "worker embed" for s in got) >= 2
        ),
    )
    gateway = _one(spans, "gateway", "POST /rerank")
    scorer = _one(spans, "scorer", "scorer rerank")
    assert scorer.parent_id == gateway.span_id and scorer.attributes["embedfleet.candidates"] == 5
    tokenizers = [s for s in spans if s.name == "tokenizer embed"]
    assert len(tokenizers) >= 2 and all(
        t.parent_id == scorer.span_id for t in tokenizers
    )  # the query and the candidates
    workers = [s for s in spans if s.name == "worker embed"]
    assert {w.parent_id for w in workers} <= {t.span_id for t in tokenizers}


def test_a_bulk_jobs_stages_are_one_trace(traced):
    client = TraceContext.start(sampled=True)
    docs = [{"id": f"t{i}", "text": text} for i, text in enumerate(mixed_texts(20))]
    r = httpx.post(
        f"{traced.base_url}/v1/jobs",
        json={"documents": docs, "batch_size": 10},
        headers={"traceparent": client.header},
        timeout=60,
    )
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    wait_until(
        lambda: httpx.get(f"{traced.base_url}/v1/jobs/{job}", timeout=10).json().get("status") == "done",
        120,
        "the job",
        list(traced.services.values()),
    )
    spans = traced.sink.wait_for(
        client.trace_id,
        lambda got: (
            sum(s.name == "worker job batch" for s in got) >= 2
            and sum(s.name == "tokenizer job batch" for s in got) == 2
        ),
    )
    publish = _one(spans, "gateway", "job publish")
    assert (
        publish.parent_id == _one(spans, "gateway", "POST /v1/jobs").span_id
        and publish.attributes["embedfleet.job"] == job
    )
    tokenizers = [s for s in spans if s.name == "tokenizer job batch"]
    assert all(t.parent_id == publish.span_id for t in tokenizers)
    workers = [s for s in spans if s.name == "worker job batch"]
    assert {w.parent_id for w in workers} <= {t.span_id for t in tokenizers}
    assert sum(w.attributes["embedfleet.rows"] for w in workers) == 20


def test_json_log_lines_carry_the_request_and_its_trace(traced):
    client = TraceContext.start(sampled=True)
    # token IDs outside the vocabulary: the tokenizer refuses them and logs the refusal
    r = httpx.post(
        f"{traced.base_url}/v1/embeddings",
        json={"model": MODEL, "input": [[101, 999_999_999, 102]]},
        headers={"traceparent": client.header},
        timeout=30,
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_tokens", r.text
    assert TraceContext.parse(r.headers["traceparent"]).trace_id == client.trace_id  # errors carry it too
    tokenizer = traced.services["tokenizer"]

    def logged() -> list[dict]:
        lines = [json.loads(line) for line in tokenizer.log().splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("trace_id") == client.trace_id]

    wait_until(lambda: bool(logged()), 10, "the tokenizer's log line", [tokenizer])
    line = logged()[0]
    assert line["level"] == "info" and line["service"] == "tokenizer" and line["request_id"]
    assert line["request_id"] in line["message"]
    spans = traced.sink.wait_for(client.trace_id, _has(("tokenizer", "tokenizer embed")))
    failed = _one(spans, "tokenizer", "tokenizer embed")
    assert failed.error and failed.attributes["embedfleet.error_code"] == "invalid_tokens"
    # every line of every service is one JSON object
    for service in traced.services.values():
        for text in service.log().splitlines():
            if text.strip():
                entry = json.loads(text)
                assert {"time", "level", "service", "message"} <= set(entry), text
