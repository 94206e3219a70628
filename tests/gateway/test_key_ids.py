"""API keys in the gateway's metrics: named by an HMAC under a secret (a random one per process unless
$EMBEDFLEET_KEY_ID_SECRET gives it), never by the key nor by a plain digest of it, which whoever reads
/metrics (an open path) could test guesses of a key against."""

from __future__ import annotations

import hashlib
import hmac
import re

from embedfleet.services.gateway.http.limits import NO_KEY
from embedfleet.services.gateway.metrics import Metrics, key_id

KEYS = ("sk-live-0001", "operator-key", "short")


def _labels(metrics: Metrics) -> set[str]:
    text = metrics.render().decode()
    return set(re.findall(r'key="([^"]*)"', text))


def _used(metrics: Metrics) -> Metrics:
    for key in (*KEYS, None):
        metrics.key_request(key, "admitted")
        metrics.key_tokens_of(key, 3)
    return metrics


def test_no_label_is_a_key_or_any_prefix_of_its_sha256():
    for metrics in (_used(Metrics()), _used(Metrics("a-secret"))):
        labels = _labels(metrics)
        assert len(labels) == len(KEYS) + 1 and NO_KEY in labels
        for key in KEYS:
            digest = hashlib.sha256(key.encode()).hexdigest()
            assert key not in metrics.render().decode()
            assert not any(label and digest.startswith(label) for label in labels), (key, labels)


def test_without_a_secret_each_process_names_a_key_its_own_way():
    assert _labels(_used(Metrics())) != _labels(_used(Metrics()))


def test_with_a_secret_the_ids_are_the_same_everywhere_and_reproducible():
    one, two = _used(Metrics("shared-secret")), _used(Metrics("shared-secret"))
    assert _labels(one) == _labels(two)
    # what the docs say to run: printf %s KEY | openssl dgst -sha256 -hmac SECRET | cut -c1-12 (after the '= ')
    expected = hmac.new(b"shared-secret", b"sk-live-0001", hashlib.sha256).hexdigest()[:12]
    assert key_id("sk-live-0001", b"shared-secret") == expected == one.key_name("sk-live-0001")
    assert expected in _labels(one)
    assert key_id(None, b"shared-secret") == NO_KEY
