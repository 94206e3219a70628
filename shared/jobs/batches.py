"""How a bulk job's documents are cut into job batches: ``batch_size`` documents each; a job of images
also at most ``batch_bytes`` bytes of files a batch (with their ids), so that every batch fits one NATS
message (images are hundreds of KB each; a batch of many small ones stays large in documents, a large
one goes alone). The cut is a function of the documents and those two numbers only: the publisher
(shared/jobs/publish.py) and the collector's Layout (shared/jobs/collector.py) make the same one, and a
job submitted again is cut as before (both numbers are in its id and request digest).
"""

from __future__ import annotations

from collections.abc import Sequence

from embedfleet.shared.jobs.image_docs import ImageDoc

# bytes of a job batch's message besides its documents: the job id and model (1,024 characters at most
# each, the job's again in the message id header), the options, the other headers (the claim's MAC,
# the submitter, the trace context); what a document adds besides its file: msgpack's headers of the
# file and its id
JOB_BATCH_ENVELOPE = 16 << 10
DOCUMENT_OVERHEAD = 16


def batch_room(max_payload: int) -> int:
    """The bytes of images (with their ids) one job batch may carry under the server's ``max_payload``."""
    return max(max_payload - JOB_BATCH_ENVELOPE, 0)


def document_bytes(doc_id: str, image: ImageDoc) -> int:
    """What an image document takes in its job batch's message."""
    return image.size + len(doc_id.encode()) + DOCUMENT_OVERHEAD


def batch_starts(docs: Sequence[tuple[str, str | ImageDoc]], batch_size: int, batch_bytes: int = 0) -> list[int]:
    """Where each batch of ``docs`` starts, and their end last ([0, ..., len(docs)]): ``batch_size``
    documents a batch; with ``batch_bytes`` (a job of images) a batch also ends before the document that
    would take it past that many bytes (a document alone passing it is a batch alone: the submitter
    refuses such a job first)."""
    n = len(docs)
    if not batch_bytes:
        return [*range(0, n, batch_size), n] if n else [0]
    starts, size, count = [0], 0, 0
    for i, (doc_id, content) in enumerate(docs):
        assert isinstance(content, ImageDoc), "a job cut by bytes is a job of images"
        cost = document_bytes(doc_id, content)
        if count and (count >= batch_size or size + cost > batch_bytes):
            starts.append(i)
            size, count = 0, 0
        size, count = size + cost, count + 1
    return [*starts, n] if n else [0]
