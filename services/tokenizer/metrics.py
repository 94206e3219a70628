"""Prometheus metrics of one tokenizer (its own registry, no process-global state): requests, inputs,
tokens and seconds, online and bulk; token batches sent; tokens per input; errors by code."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from embedfleet.services.tokenizer.encoder import TextEncoder

QUEUES = ("online", "bulk")
_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_INPUT_TOKENS = tuple(float(2**i) for i in range(16))  # 1 .. 32768 tokens per input


class ArrayHistogram:
    """A histogram fed a whole array at a time: one numpy pass per request instead of a call per input
    (a request of 2,048 inputs would otherwise spend milliseconds in ``observe``)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: dict[str, str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._name, self._doc, self._labels = name, documentation, labels
        self._edges = np.asarray(buckets, dtype=np.float64)
        self._counts = np.zeros(len(buckets) + 1, dtype=np.int64)  # the last one: above every edge (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()  # scrapes read from the exposition's thread
        registry.register(self)

    def observe(self, values: np.ndarray) -> None:
        # a value v falls in the first bucket whose upper bound ("le") is >= v
        add = np.bincount(np.searchsorted(self._edges, values, side="left"), minlength=len(self._counts))
        total = float(values.sum())
        with self._lock:
            self._counts += add
            self._sum += total

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            cumulative = np.cumsum(self._counts)
            total = self._sum
        family = HistogramMetricFamily(self._name, self._doc, labels=list(self._labels))
        buckets = [(floatToGoString(edge), int(n)) for edge, n in zip(self._edges, cumulative[:-1])]
        family.add_metric(list(self._labels.values()), [*buckets, ("+Inf", int(cumulative[-1]))], total)
        yield family


def lengths(ids: Sequence[Sequence[int]]) -> np.ndarray:
    return np.fromiter((len(seq) for seq in ids), dtype=np.int64, count=len(ids))


class TokenizerMetrics:
    def __init__(self, model: str) -> None:
        self.registry = r = CollectorRegistry()
        self._model = model
        by_queue = ["model", "queue"]
        self._requests = Counter(
            "embedfleet_tokenizer_requests",
            "requests handled, by kind (embed, tokenize, decode, chunk)",
            ["model", "kind"],
            registry=r,
        )
        self._errors = Counter("embedfleet_tokenizer_errors", "error replies by code", ["model", "code"], registry=r)
        inputs = Counter(
            "embedfleet_tokenizer_inputs",
            "inputs tokenized (texts, pairs or token-ID lists), by queue",
            by_queue,
            registry=r,
        )
        tokens = Counter(
            "embedfleet_tokenizer_tokens", "tokens made, special tokens included, by queue", by_queue, registry=r
        )
        seconds = Histogram(
            "embedfleet_tokenizer_seconds",
            "seconds tokenizing one embed request (online: requests "
            "tokenized together each count their group's) or one job batch (bulk)",
            by_queue,
            buckets=_SECONDS,
            registry=r,
        )
        self._inputs = {q: inputs.labels(model, q) for q in QUEUES}
        self._tokens = {q: tokens.labels(model, q) for q in QUEUES}
        self._seconds = {q: seconds.labels(model, q) for q in QUEUES}
        self._chunks = Counter(
            "embedfleet_tokenizer_chunks",
            "token batches sent to the workers for online requests",
            ["model"],
            registry=r,
        ).labels(model)
        self._bundled = Counter(
            "embedfleet_tokenizer_bundled",
            "embed requests that came several to a NATS message "
            "(a Requests message: what a gateway published in one pass of its loop)",
            ["model"],
            registry=r,
        ).labels(model)
        self._bulk_batches = Counter(
            "embedfleet_tokenizer_bulk_batches", "job batches tokenized", ["model"], registry=r
        ).labels(model)
        self._refused_batches = Counter(
            "embedfleet_tokenizer_refused_batches",
            "job batches refused unread: naming no submitted job, or not signed with its job's secret",
            ["model"],
            registry=r,
        ).labels(model)
        self._input_tokens = ArrayHistogram(
            "embedfleet_tokenizer_input_tokens", "tokens per input, online and bulk", {"model": model}, _INPUT_TOKENS, r
        )

    def request(self, kind: str, count: int = 1) -> None:
        self._requests.labels(self._model, kind).inc(count)

    def bundled(self, count: int) -> None:
        self._bundled.inc(count)

    def error(self, code: str) -> None:
        self._errors.labels(self._model, code).inc()

    def embedded(self, ids: Sequence[Sequence[int]], seconds: float, chunks: int, requests: int = 1) -> None:
        """``requests`` online embed requests tokenized together: their inputs' token IDs, the seconds
        each of them took (the group's), the batches sent."""
        self._tokenized("online", ids, seconds, requests)
        self._chunks.inc(chunks)

    def refused_batch(self) -> None:
        self._refused_batches.inc()

    def bulk_batch(self, ids: Sequence[Sequence[int]], seconds: float) -> None:
        """A job batch tokenized: its documents' token IDs and the seconds they took."""
        self._bulk_batches.inc()
        self._tokenized("bulk", ids, seconds)

    def _tokenized(self, queue: str, ids: Sequence[Sequence[int]], seconds: float, times: int = 1) -> None:
        n = lengths(ids)
        self._inputs[queue].inc(len(n))
        self._tokens[queue].inc(int(n.sum()))
        for _ in range(times):
            self._seconds[queue].observe(seconds)
        self._input_tokens.observe(n)

    def bulk_view(self, encoder: TextEncoder) -> BulkEncoder:
        """``encoder`` as the bulk path sees it: each ``encode`` is one job batch, counted here."""
        return BulkEncoder(encoder, self)


class BulkEncoder:
    """A TextEncoder whose ``encode`` counts a job batch (the bulk tokenizer calls it once per batch)."""

    def __init__(self, encoder: TextEncoder, metrics: TokenizerMetrics) -> None:
        self._encoder = encoder
        self._metrics = metrics

    def encode(self, texts: list[str], truncate: bool = True, direction: str = "right") -> list[list[int]]:
        start = time.perf_counter()
        ids = self._encoder.encode(texts, truncate, direction)
        self._metrics.bulk_batch(ids, time.perf_counter() - start)
        return ids

    def refused(self) -> None:
        """A job batch refused before anything of it was read (shared/jobs/claims.py)."""
        self._metrics.refused_batch()

    def counted(self, ids: list[list[int]], seconds: float) -> None:
        """A job batch tokenized otherwise (cut into chunks: their sequences ``ids``), counted as one."""
        self._metrics.bulk_batch(ids, seconds)

    def __getattr__(self, name: str) -> Any:  # every other method: the encoder's own
        return getattr(self._encoder, name)
