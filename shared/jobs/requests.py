"""What a job was asked for, recorded in its state so that its id keeps meaning that one job: a digest
of the request (model, batch size, options, every document) and, on a gateway with API keys, a digest
of the key that made it (never the key). The same request again resumes the job; another request
under the same id is refused, as is one by another key."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

from embedfleet.shared.jobs.documents import Document
from embedfleet.shared.jobs.state import JobState


@dataclass(frozen=True, slots=True)
class Claim:
    """A submission's ``request`` digest, and its ``owner`` (None: no key, e.g. reindex)."""

    request: str
    owner: str | None = None


def request_digest(
    model: str, docs: Sequence[Document], batch_size: int, options, chunking=None, batch_bytes: int = 0
) -> str:
    """SHA-256 over what makes a job's batches: the same file or documents (an image: its size and
    digest), model, batch size (and a job of images' ``batch_bytes``), options and chunking (a
    JobChunking, or None) give the same digest, whichever way (POST /v1/jobs, reindex) they were submitted."""
    head = [model, batch_size, dataclasses.asdict(options), chunking.record() if chunking is not None else None]
    if batch_bytes:  # a job of images; a text job's digest as it always was
        head.append(batch_bytes)
    h = hashlib.sha256(json.dumps(head, sort_keys=True).encode())
    for doc_id, content in docs:  # each part length-prefixed: no two lists of documents hash alike
        for part in (doc_id.encode(), content.encode() if isinstance(content, str) else content.key):
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
    return h.hexdigest()


def owner_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def claim_problem(state: JobState | None, claim: Claim) -> str | None:
    """Why the job recorded as ``state`` is not the one ``claim`` asks for (None: no job yet, or the
    same request again)."""
    if state is None or not state.submitted:
        return None
    if claim.owner is not None and state.owner != claim.owner:
        return f"job id {state.job} is taken: give another job id"
    if state.request != claim.request:
        return (
            f"job {state.job} exists with other documents, model, batch size or options: give it another job id "
            "(the same request again resumes it)"
        )
    return None


def record_claim(state: JobState, claim: Claim) -> JobState:
    """``state`` with the claim's digests, unless it has them (the first submission's stay)."""
    return replace(state, request=state.request or claim.request, owner=state.owner or claim.owner)
