"""A job batch of images in the tokenizer (a two-tower model's): each document's file decoded and
prepared as the online path prepares an image (services/tokenizer/images.py), one at a time, under the
tokenizer's own --max-image-bytes and --max-image-pixels. An image that is refused or cannot be decoded
is given up alone (its document a dead letter naming it, as a chunked job's document cut into too many
chunks is); the others become token batches of pixels: runs of consecutive rows of the job batch (a
given-up document ends one), each small enough that its message fits the server's max_payload with its
documents' ids. The same batch prepared again (delivered again) makes the same token batches. No NATS here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from embedfleet.services.tokenizer.images import ImagePreparer
from embedfleet.shared.images.decode import ImageError
from embedfleet.shared.protocol import JobBatch

# bytes a row adds to a token batch besides its pixels and its document id: msgpack's header of the id,
# its cumulative length (int32)
_ROW_BYTES = 16


@dataclass(frozen=True, slots=True)
class PreparedImages:
    """A job batch's images that were prepared: ``pixels`` [n, C, H, W] uint8, the image of row ``rows[i]``
    of the batch at ``i`` (rows ascending); and the rows given up, with why."""

    pixels: np.ndarray
    rows: list[int]
    failed: list[tuple[int, str]]


def prepare_batch(preparer: ImagePreparer, job: JobBatch) -> PreparedImages:
    """Every image of ``job`` prepared, or given up naming its document."""
    assert job.images is not None  # a batch of images
    pixels: list[np.ndarray] = []
    rows: list[int] = []
    failed: list[tuple[int, str]] = []
    for row, data in enumerate(job.images):
        try:
            pixels.append(preparer.pixels(data))
            rows.append(row)
        except ImageError as exc:
            failed.append((row, f"document {job.doc_ids[row][:200]!r}: {exc}"))
    stacked = np.stack(pixels) if pixels else np.zeros((0, 3, *preparer.processing.output_size), np.uint8)
    return PreparedImages(stacked, rows, failed)


def image_runs(
    prepared: PreparedImages, doc_ids: list[str], max_bytes: int, max_rows: int
) -> Iterator[tuple[int, int]]:
    """[lo, hi) into ``prepared``'s images for each token batch: consecutive rows of the job batch, at
    most ``max_rows`` of them and ``max_bytes`` of pixels and ids (an image alone may pass it: the
    caller's check of the message's size refuses that batch)."""
    each = int(np.prod(prepared.pixels.shape[1:]))
    lo, n = 0, len(prepared.rows)
    while lo < n:
        hi, size = lo, 0
        while hi < n and hi - lo < max_rows:
            cost = each + len(doc_ids[prepared.rows[hi]].encode()) + _ROW_BYTES
            consecutive = hi == lo or prepared.rows[hi] == prepared.rows[hi - 1] + 1
            if hi > lo and (not consecutive or size + cost > max_bytes):
                break
            size, hi = size + cost, hi + 1
        yield lo, hi
        lo = hi
