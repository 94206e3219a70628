"""The scorer's options: rerank requests handled at once, and the candidates scored in one part."""

from __future__ import annotations

from embedfleet.shared.config.option import Option, declare, positive_int

OPTIONS: tuple[Option, ...] = (
    declare(
        "--max-concurrency",
        "EMBEDFLEET_SCORER_CONCURRENCY",
        64,
        "rerank requests handled at once",
        {"scorer"},
        "scorer",
        type=positive_int,
    ),
    declare(
        "--split",
        "EMBEDFLEET_SCORER_SPLIT",
        32,
        "candidates per part: a rerank's parts are scored at once, spread over the workers",
        {"scorer"},
        "scorer",
        type=positive_int,
    ),
)
