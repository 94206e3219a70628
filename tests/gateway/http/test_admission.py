"""Admission: --max-in-flight slots, the probes exempt."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from embedfleet.services.gateway.http.admission import Admission


def test_slots_are_taken_and_given_back_and_shown():
    registry = CollectorRegistry()
    admission = Admission(2, Gauge("in_flight", "", registry=registry))
    assert admission.enter() and admission.enter()
    assert not admission.enter() and admission.taken == 2 and registry.get_sample_value("in_flight") == 2
    admission.leave()
    assert admission.enter() and admission.taken == 2
    admission.leave()
    admission.leave()
    assert admission.taken == 0 and registry.get_sample_value("in_flight") == 0


def test_only_the_probes_are_exempt():
    for method, path in (
        ("GET", "/health"),
        ("HEAD", "/health"),
        ("GET", "/ping"),
        ("GET", "/"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
    ):
        assert Admission.exempt(method, path), (method, path)
    for method, path in (
        ("POST", "/"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs/x"),
        ("DELETE", "/v1/jobs/x"),
        ("GET", "/v1/models"),
        ("GET", "/info"),
        ("POST", "/embed"),
        ("POST", "/decode"),
    ):
        assert not Admission.exempt(method, path), (method, path)
