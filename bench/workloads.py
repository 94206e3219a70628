"""The workloads of the performance notes, made of real text (the corpus the tests use)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.support.corpus import long_texts, medium_texts


@dataclass(frozen=True)
class Workload:
    name: str
    texts: list[str]
    per_request: int  # texts per request (the reference encodes with this batch size)


def workloads(scale: float = 1.0) -> dict[str, Workload]:
    return {
        "long": Workload("long", long_texts(int(192 * scale)), 32),
        "medium": Workload("medium", medium_texts(int(512 * scale)), 8),
    }
