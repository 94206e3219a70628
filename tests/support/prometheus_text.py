"""Reading Prometheus text exposition in tests: one sample's value by metric name and labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of the exposition ``text``: (sample name, its labels) -> value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    """The value of sample ``name`` with exactly ``labels``; a missing one fails, naming what there is."""
    found = samples(text)
    key = (name, frozenset(labels.items()))
    if key not in found:
        near = sorted(f"{n}{dict(labelled)}" for n, labelled in found if n == name)
        raise AssertionError(f"no sample {name}{labels}; {name} has: {near or 'none'}")
    return found[key]


def has(text: str, name: str, **labels: str) -> bool:
    return (name, frozenset(labels.items())) in samples(text)
