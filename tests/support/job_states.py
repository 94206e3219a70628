"""A job's state as a test records it: a submitted job (the fields a submission records together,
shared/jobs/state.py's SUBMISSION), without publishing anything."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from embedfleet.shared.jobs.state import JobState


def submitted(documents: int, **fields: Any) -> Callable[[JobState], JobState]:
    """A change for ``update_state``: the state records a job of ``documents`` documents (model "m", read
    inline, dense float32 vectors unless ``fields`` say otherwise), and ``fields``."""
    recorded = {"model": "m", "input": "inline", "embedding_type": "float32", "output": "dense", **fields}
    return lambda state: replace(state, documents=documents, **recorded)
