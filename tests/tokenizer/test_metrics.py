"""The tokenizer's metrics: online requests and job batches counted apart, tokens per input in a
histogram fed an array at a time (the same buckets as prometheus_client's own Histogram)."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from embedfleet.services.tokenizer.metrics import ArrayHistogram, TokenizerMetrics
from tests.support.prometheus_text import samples, value


def _text(metrics: TokenizerMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_online_requests_inputs_tokens_chunks():
    metrics = TokenizerMetrics("m")
    metrics.request("embed")
    metrics.request("embed")
    metrics.request("tokenize")
    metrics.embedded([[1, 2, 3], list(range(40))], 0.002, chunks=2)
    metrics.embedded([np.arange(5, dtype=np.int32)], 0.001, chunks=1)
    metrics.error("input_too_long")
    text = _text(metrics)
    assert value(text, "embedfleet_tokenizer_requests_total", model="m", kind="embed") == 2
    assert value(text, "embedfleet_tokenizer_requests_total", model="m", kind="tokenize") == 1
    assert value(text, "embedfleet_tokenizer_inputs_total", model="m", queue="online") == 3
    assert value(text, "embedfleet_tokenizer_tokens_total", model="m", queue="online") == 48
    assert value(text, "embedfleet_tokenizer_tokens_total", model="m", queue="bulk") == 0
    assert value(text, "embedfleet_tokenizer_chunks_total", model="m") == 3
    assert value(text, "embedfleet_tokenizer_seconds_count", model="m", queue="online") == 2
    assert value(text, "embedfleet_tokenizer_seconds_sum", model="m", queue="online") == pytest.approx(0.003)
    assert value(text, "embedfleet_tokenizer_errors_total", model="m", code="input_too_long") == 1
    # tokens per input: 3, 40, 5
    assert value(text, "embedfleet_tokenizer_input_tokens_bucket", model="m", le="2.0") == 0
    assert value(text, "embedfleet_tokenizer_input_tokens_bucket", model="m", le="4.0") == 1
    assert value(text, "embedfleet_tokenizer_input_tokens_bucket", model="m", le="8.0") == 2
    assert value(text, "embedfleet_tokenizer_input_tokens_bucket", model="m", le="64.0") == 3
    assert value(text, "embedfleet_tokenizer_input_tokens_bucket", model="m", le="+Inf") == 3
    assert value(text, "embedfleet_tokenizer_input_tokens_count", model="m") == 3
    assert value(text, "embedfleet_tokenizer_input_tokens_sum", model="m") == 48


class _Encoder:
    """Stands in for TextEncoder: fixed ids, and one other method the bulk path uses."""

    def encode(self, texts, truncate=True, direction="right"):
        return [[7] * (len(t) + 2) for t in texts]

    def with_prompt(self, texts, options):
        return ["p:" + t for t in texts]


def test_the_bulk_view_counts_each_encode_as_a_job_batch():
    metrics = TokenizerMetrics("m")
    bulk = metrics.bulk_view(_Encoder())
    assert bulk.with_prompt(["a"], None) == ["p:a"]  # other methods: the encoder's own
    assert bulk.encode(["ab", "abcd"], True, "right") == [[7] * 4, [7] * 6]
    bulk.encode(["x"])
    text = _text(metrics)
    assert value(text, "embedfleet_tokenizer_bulk_batches_total", model="m") == 2
    assert value(text, "embedfleet_tokenizer_inputs_total", model="m", queue="bulk") == 3
    assert value(text, "embedfleet_tokenizer_tokens_total", model="m", queue="bulk") == 13
    assert value(text, "embedfleet_tokenizer_seconds_count", model="m", queue="bulk") == 2
    assert value(text, "embedfleet_tokenizer_inputs_total", model="m", queue="online") == 0
    assert value(text, "embedfleet_tokenizer_chunks_total", model="m") == 0
    assert value(text, "embedfleet_tokenizer_input_tokens_count", model="m") == 3


def test_array_histogram_matches_prometheus_clients_histogram():
    buckets = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
    values = np.random.default_rng(0).integers(0, 50, size=500)
    values[:6] = buckets  # values on a bound belong to its bucket (le: less or equal)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    hist = ArrayHistogram("lengths", "tokens per input", {"model": "m"}, buckets, ours)
    hist.observe(values[:100])
    hist.observe(values[100:])
    reference = Histogram("lengths", "tokens per input", ["model"], buckets=buckets, registry=theirs).labels("m")
    for v in values:
        reference.observe(float(v))
    assert samples(generate_latest(ours).decode()) == {
        k: v for k, v in samples(generate_latest(theirs).decode()).items() if k[0] != "lengths_created"
    }
