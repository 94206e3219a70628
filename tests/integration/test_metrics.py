"""Every service's Prometheus metrics on a port of its own (--metrics-port), scraped from real
processes: the counters move by what the requests did (the tokens the answers' usage reports, the
inputs sent, the job's documents), the bulk stages' consumer lag rises while the worker is stopped and
falls back to 0, and the job's progress reaches its documents."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.metrics_fleet import MODEL, Fleet, metrics_fleet
from tests.support.corpus import mixed_texts
from tests.support.procs import wait_until
from tests.support.prometheus_text import has, samples, value

pytestmark = pytest.mark.integration

PREFIX = "metricstest"  # subjects and streams of their own: no other test's jobs or consumers here


@pytest.fixture(scope="module")
def fleet(nats_url: str, tmp_path_factory) -> Iterator[Fleet]:
    with metrics_fleet(nats_url, PREFIX, tmp_path_factory.mktemp("metrics-logs")) as fleet:
        yield fleet


def _delta(before: str, after: str, name: str, **labels: str) -> float:
    old = samples(before).get((name, frozenset(labels.items())), 0.0)
    return value(after, name, **labels) - old


def _sum(text: str, name: str, **labels: str) -> float:
    """The sum of ``name`` over every label set that holds ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples(text).items() if n == name and want <= ls)


def _settled(fleet: Fleet, role: str, check) -> str:
    """Scrape ``role`` until ``check(text)`` holds (a counter is updated just after the answer leaves)."""
    texts = []

    def ok() -> bool:
        texts.append(fleet.scrape(role))
        return check(texts[-1])

    wait_until(ok, 15, f"{role} metrics", list(fleet.services.values()))
    return texts[-1]


def test_online_requests_move_every_services_counters(fleet):
    before = {role: fleet.scrape(role) for role in ("tokenizer", "worker", "gateway")}
    texts = mixed_texts(12)
    tokens = 0
    start = time.monotonic()
    for part in (texts[:1], texts[1:5], texts[5:]):  # one at a time: every request is at least one batch
        r = httpx.post(f"{fleet.base_url}/v1/embeddings", json={"model": MODEL, "input": part}, timeout=60)
        assert r.status_code == 200, r.text
        tokens += r.json()["usage"]["prompt_tokens"]
    elapsed = time.monotonic() - start
    assert tokens > 12

    worker = _settled(
        fleet,
        "worker",
        lambda t: _delta(before["worker"], t, "embedfleet_worker_rows_total", model=MODEL, queue="online") >= 12,
    )
    w = lambda name, **labels: _delta(before["worker"], worker, name, **labels)  # noqa: E731
    assert w("embedfleet_worker_tokens_total", model=MODEL, queue="online") == tokens
    assert w("embedfleet_worker_rows_total", model=MODEL, queue="online") == 12
    assert w("embedfleet_worker_batch_tokens_sum", model=MODEL) == tokens
    batches = w("embedfleet_worker_batches_total", model=MODEL, queue="online")
    assert batches >= 3
    assert w("embedfleet_worker_batch_tokens_count", model=MODEL) == batches
    assert (
        _sum(worker, "embedfleet_worker_forward_seconds_count", model=MODEL)
        - _sum(before["worker"], "embedfleet_worker_forward_seconds_count", model=MODEL)
    ) == batches
    # on a CPU every forward runs eagerly: no CUDA graph captured or replayed
    assert w("embedfleet_worker_forwards_total", model=MODEL, run="eager") == batches
    assert value(worker, "embedfleet_worker_forwards_total", model=MODEL, run="replay") == 0
    assert value(worker, "embedfleet_worker_forwards_total", model=MODEL, run="captured") == 0
    assert 0 < w("embedfleet_worker_busy_seconds_total", model=MODEL, replica="0") <= elapsed
    assert value(worker, "embedfleet_worker_queue_depth", model=MODEL, queue="online") == 0
    assert has(worker, "embedfleet_worker_queue_depth", model=MODEL, queue="bulk")
    assert value(worker, "embedfleet_worker_max_batch_tokens", model=MODEL) == 1024

    tokenizer = _settled(
        fleet,
        "tokenizer",
        lambda t: (
            _delta(before["tokenizer"], t, "embedfleet_tokenizer_inputs_total", model=MODEL, queue="online") >= 12
        ),
    )
    t = lambda name, **labels: _delta(before["tokenizer"], tokenizer, name, **labels)  # noqa: E731
    assert t("embedfleet_tokenizer_requests_total", model=MODEL, kind="embed") == 3
    assert t("embedfleet_tokenizer_inputs_total", model=MODEL, queue="online") == 12
    assert t("embedfleet_tokenizer_tokens_total", model=MODEL, queue="online") == tokens
    assert t("embedfleet_tokenizer_input_tokens_count", model=MODEL) == 12
    assert t("embedfleet_tokenizer_input_tokens_sum", model=MODEL) == tokens
    assert t("embedfleet_tokenizer_chunks_total", model=MODEL) >= 3
    assert t("embedfleet_tokenizer_seconds_count", model=MODEL, queue="online") == 3

    gateway = fleet.scrape("gateway")
    g = lambda name, **labels: _delta(before["gateway"], gateway, name, **labels)  # noqa: E731
    assert g("embedfleet_tokens_total", model=MODEL) == tokens
    assert g("embedfleet_requests_total", route="/v1/embeddings", code="200") == 3
    for stage in ("tokenize", "queue", "inference"):
        assert g("embedfleet_model_stage_seconds_count", model=MODEL, stage=stage) == 3
    # the metrics port serves the registry that GET /metrics on the HTTP port serves
    http = httpx.get(f"{fleet.base_url}/metrics", timeout=10).text
    assert value(http, "embedfleet_tokens_total", model=MODEL) == value(gateway, "embedfleet_tokens_total", model=MODEL)


def test_a_rerank_moves_the_scorers_counters(fleet):
    before = fleet.scrape("scorer")
    docs = ["a fox in the forest", "stock prices fell", "the quick brown fox", "rain tomorrow", "foxes are canids"]
    r = httpx.post(f"{fleet.base_url}/v1/rerank", json={"model": MODEL, "query": "fox", "documents": docs}, timeout=60)
    assert r.status_code == 200, r.text
    scorer = _settled(
        fleet,
        "scorer",
        lambda t: _delta(before, t, "embedfleet_scorer_reranks_total", model=MODEL, kind="bi-encoder") >= 1,
    )
    assert _delta(before, scorer, "embedfleet_scorer_reranks_total", model=MODEL, kind="bi-encoder") == 1
    assert _delta(before, scorer, "embedfleet_scorer_candidates_total", model=MODEL) == 5
    assert _delta(before, scorer, "embedfleet_scorer_seconds_count", model=MODEL) == 1
    assert value(scorer, "embedfleet_scorer_in_flight", model=MODEL) == 0
    assert _sum(scorer, "embedfleet_scorer_errors_total", model=MODEL) == 0


def test_a_bulk_job_shows_lag_while_the_worker_is_stopped_then_its_progress(fleet):
    before = {role: fleet.scrape(role) for role in ("tokenizer", "worker")}
    docs = [{"id": f"m{i}", "text": text} for i, text in enumerate(mixed_texts(40))]
    worker = fleet.services["worker"].proc.pid
    os.kill(worker, signal.SIGSTOP)  # the job's token batches wait for it in the bulk stream
    try:
        # at once: the gateway takes a worker silent for three seconds for gone, and refuses jobs without one
        r = httpx.post(f"{fleet.base_url}/v1/jobs", json={"documents": docs, "batch_size": 16}, timeout=60)
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        waiting = _settled(
            fleet,
            "gateway",
            lambda t: (
                _sum(t, "embedfleet_bulk_lag", stage="worker") >= 1
                and has(t, "embedfleet_job_documents", job_id=job, model=MODEL, state="total")
            ),
        )
        assert value(waiting, "embedfleet_job_documents", job_id=job, model=MODEL, state="total") == 40
        assert value(waiting, "embedfleet_job_documents", job_id=job, model=MODEL, state="done") == 0
        assert value(waiting, "embedfleet_jobs", status="running") >= 1
    finally:
        os.kill(worker, signal.SIGCONT)

    state: dict = {}

    def done() -> bool:
        nonlocal state
        state = httpx.get(f"{fleet.base_url}/v1/jobs/{job}", timeout=10).json()
        return state.get("status") == "done"

    wait_until(done, 120, "the job", list(fleet.services.values()))
    assert state["done"] == 40 and state["tokens"] > 0
    after = _settled(
        fleet,
        "gateway",
        lambda t: (
            _sum(t, "embedfleet_job_documents", job_id=job, state="done") == 40 and _sum(t, "embedfleet_bulk_lag") == 0
        ),
    )
    assert value(after, "embedfleet_job_documents", job_id=job, model=MODEL, state="failed") == 0
    assert _sum(after, "embedfleet_bulk_lag", stage="tokenizer") == 0
    assert has(after, "embedfleet_bulk_metrics_updated")

    worker_text = fleet.scrape("worker")
    assert (
        _delta(before["worker"], worker_text, "embedfleet_worker_tokens_total", model=MODEL, queue="bulk")
        == state["tokens"]
    )
    assert _delta(before["worker"], worker_text, "embedfleet_worker_rows_total", model=MODEL, queue="bulk") == 40
    assert _delta(before["worker"], worker_text, "embedfleet_worker_batches_total", model=MODEL, queue="bulk") >= 1
    tokenizer = fleet.scrape("tokenizer")
    assert _delta(before["tokenizer"], tokenizer, "embedfleet_tokenizer_bulk_batches_total", model=MODEL) == 3
    assert _delta(before["tokenizer"], tokenizer, "embedfleet_tokenizer_inputs_total", model=MODEL, queue="bulk") == 40
    assert (
        _delta(before["tokenizer"], tokenizer, "embedfleet_tokenizer_tokens_total", model=MODEL, queue="bulk")
        == state["tokens"]
    )
