"""The Grafana dashboard against a real Prometheus scraping a real stack: Prometheus (Debian's package)
runs deploy/prometheus/kubernetes.yml's scrape job, its Kubernetes discovery replaced by static
targets carrying what discovery says of the pods deploy/k8s/base renders (so the job's relabelling
picks the four service pods, drops NATS and the init job, and sets namespace, pod and container);
traffic touches every panel (embeddings, reranks, a request the tokenizer refuses, a rerank the
worker refuses as overloaded, a bulk job); then every query of deploy/grafana/embedfleet.json,
its variables filled in, returns numbers, and none with another model chosen."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.deploy import dashboard as dash
from tests.deploy import scrape
from tests.deploy.manifests import render
from tests.integration.metrics_fleet import MODEL, Fleet, metrics_fleet
from tests.integration.prometheus_server import Prometheus, finite
from tests.support.corpus import mixed_texts
from tests.support.procs import Service, wait_until

pytestmark = pytest.mark.integration

PREFIX = "dashboardtest"  # subjects and streams of its own: no other test's jobs or consumers here
WORKLOADS = {"gateway": "gateway", "tokenizer": "tokenizer", "worker": "gpu-worker", "scorer": "scorer"}
# the worker refuses an online token batch of more than this many tokens: three long documents (256
# tokens each once truncated) make one, the short texts below never do
MAX_QUEUED_TOKENS = 600
SHORT = [
    "a fox in the forest",
    "stock prices fell sharply",
    "the quick brown fox jumps",
    "rain tomorrow",
    "foxes are small canids",
    "how do I sort a list in Python?",
]
LONG = [f"{word} jumps over the lazy dog. " * 60 for word in ("fox", "cat", "hare")]  # ~540 tokens each


@dataclass(frozen=True)
class Stage:
    fleet: Fleet
    prometheus: Prometheus


@pytest.fixture(scope="module")
def stage(nats_url: str, tmp_path_factory) -> Iterator[Stage]:
    work = tmp_path_factory.mktemp("dashboard")
    extra = {"worker": ["--max-queued-tokens", str(MAX_QUEUED_TOKENS)]}
    with metrics_fleet(nats_url, PREFIX, work, extra) as fleet:
        ports = {WORKLOADS[role]: port for role, port in fleet.ports.items()}
        targets = scrape.discovered(render("base"), "127.0.0.1", ports)
        prometheus = Prometheus(scrape.local_config(scrape.load(), targets, interval="1s"), work)
        try:
            prometheus.wait_ready()
            _wait_scraping(prometheus, list(fleet.services.values()))
            yield Stage(fleet, prometheus)
        finally:
            prometheus.stop()


def _wait_scraping(prometheus: Prometheus, procs: list[Service]) -> None:
    """Until Prometheus has scraped each service once, and successfully (else: what its targets say)."""
    active: list[dict] = []

    def up() -> bool:
        active[:] = prometheus.targets()["activeTargets"]
        return len(active) == len(WORKLOADS) and all(t["health"] == "up" for t in active)

    try:
        wait_until(up, 20, "every service scraped", procs)
    except TimeoutError:
        states = "; ".join(f"{t['scrapeUrl']} {t['health']} {t['lastError']!r}" for t in active)
        raise AssertionError(f"Prometheus does not scrape the services: {states}") from None


def _scraped_after(prometheus: Prometheus, t: float) -> bool:
    """Every service's last scrape began after unix time ``t``."""
    last = prometheus.query(f'timestamp(up{{job="{scrape.JOB}"}})')
    return len(last) == len(WORKLOADS) and min(float(s["value"][1]) for s in last) > t


def _traffic(base_url: str) -> None:
    """One round of requests touching every panel: embeddings, a rerank, two refused requests."""
    for part in (SHORT[:2], SHORT[2:]):
        r = httpx.post(f"{base_url}/v1/embeddings", json={"model": MODEL, "input": part}, timeout=60)
        assert r.status_code == 200, r.text
    r = httpx.post(f"{base_url}/rerank", json={"query": "fox", "texts": SHORT}, timeout=60)
    assert r.status_code == 200, r.text
    # token IDs outside the vocabulary: the tokenizer refuses them (invalid_tokens)
    r = httpx.post(f"{base_url}/v1/embeddings", json={"model": MODEL, "input": [[10**6]]}, timeout=60)
    assert r.status_code == 422, r.text
    # 768 tokens in one batch, more than the worker's whole queue holds: the worker refuses it as a batch
    # no queue could take (invalid_request, naming --max-queued-tokens), the scorer answers so
    r = httpx.post(f"{base_url}/rerank", json={"query": "fox", "texts": LONG, "truncate": True}, timeout=60)
    assert r.status_code == 400 and "--max-queued-tokens" in r.text, r.text


def _job(base_url: str) -> str:
    docs = [{"id": f"d{i}", "text": t} for i, t in enumerate(mixed_texts(20))]
    r = httpx.post(f"{base_url}/v1/jobs", json={"documents": docs, "batch_size": 8}, timeout=60)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def test_every_dashboard_query_returns_data(stage):
    fleet, prometheus = stage.fleet, stage.prometheus
    procs = list(fleet.services.values())
    start = time.time()
    # two rounds a scrape apart: a series a round creates has moved by the next scrape, so rate() > 0
    _traffic(fleet.base_url)
    mark = time.time()
    wait_until(lambda: _scraped_after(prometheus, mark), 30, "a scrape of every service", procs)
    _traffic(fleet.base_url)
    job = _job(fleet.base_url)
    wait_until(
        lambda: httpx.get(f"{fleet.base_url}/v1/jobs/{job}", timeout=10).json().get("status") == "done",
        60,
        "the job",
        procs,
    )
    # the gateway reads job states every 5 s; then every service scraped twice more (two samples for rate)
    done = f'max(embedfleet_job_documents{{job_id="{job}", state="done"}})'
    wait_until(
        lambda: [float(s["value"][1]) for s in prometheus.query(done)] == [20.0], 30, "the job's progress", procs
    )
    mark = time.time()
    wait_until(lambda: _scraped_after(prometheus, mark + 1.0), 30, "two scrapes after the traffic", procs)

    window = f"{math.ceil(time.time() - start) + 5}s"  # $__rate_interval: every sample since the traffic began
    board = dash.load()
    empty, nan = [], []
    for q in dash.queries(board):
        result = prometheus.query(q.filled(MODEL, window))
        if not result:
            empty.append(str(q))
        elif not finite(result):
            nan.append(str(q))
    report = "".join(f"\n  no series: {e}" for e in empty) + "".join(f"\n  only NaN: {e}" for e in nan)
    assert not empty and not nan, f"dashboard queries without data ({len(empty) + len(nan)}):{report}"

    # another model chosen, every query that names $model shows nothing: the variable filters
    leaks = [
        str(q)
        for q in dash.queries(board)
        if "$model" in q.expr and prometheus.query(q.filled("no-such-model", window))
    ]
    assert not leaks, "queries showing data of a model not chosen:\n  " + "\n  ".join(leaks)

    # the progress panel shows the job, by its id, finished
    progress = next(q for q in dash.queries(board) if q.panel == "Job progress")
    rows = {s["metric"].get("job_id"): float(s["value"][1]) for s in prometheus.query(progress.filled(MODEL, window))}
    assert rows.get(job) == 1.0, rows


def test_every_selector_of_a_model_metric_filters_by_the_model_variable(stage):
    series = stage.prometheus.api("series", **{"match[]": '{__name__=~"embedfleet_.+"}'})
    with_model = {s["__name__"] for s in series if "model" in s}
    assert "embedfleet_worker_queue_depth" in with_model and "embedfleet_requests_total" not in with_model
    unfiltered = sorted(
        {
            f"{name} ({q.panel})"
            for q in dash.queries(dash.load())
            for name, matchers in q.selectors()
            if name in with_model and 'model=~"$model"' not in matchers
        }
    )
    assert not unfiltered, f"selectors of metrics with a model label that ignore $model: {unfiltered}"


def test_the_model_variable_lists_the_served_model(stage):
    model = dash.variable(dash.load(), "model")
    metric = model["definition"].removeprefix("label_values(").split(",")[0]
    assert MODEL in stage.prometheus.api("label/model/values", **{"match[]": metric})


def test_the_scrape_job_picks_the_annotated_pods_and_labels_them(stage):
    targets = stage.prometheus.targets()
    active = {t["labels"]["container"]: t for t in targets["activeTargets"]}
    # the gateway's two container ports (http, metrics) are one target once rewritten to the annotated port
    assert len(targets["activeTargets"]) == len(WORKLOADS) and set(active) == set(WORKLOADS)
    for role, t in active.items():
        assert t["scrapeUrl"] == f"http://127.0.0.1:{stage.fleet.ports[role]}/metrics", t
        assert t["labels"]["namespace"] == "embedfleet" and t["labels"]["pod"] == f"{WORKLOADS[role]}-0", t
        assert t["labels"]["app"] == WORKLOADS[role] and t["health"] == "up", t
    dropped = {t["discoveredLabels"]["__meta_kubernetes_pod_name"] for t in targets["droppedTargets"]}
    assert {"nats-0", "embedfleet-init-0"} <= dropped, dropped
