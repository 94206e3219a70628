"""A job batch of images in the tokenizer (a two-tower model's): each document's file decoded and
prepared as the online path prepares an image (services/tokenizer/images.py), one at a time, under the
tokenizer's own --max-image-bytes and --max-image-pixels. An image that is refused or cannot be decoded
is given up alone (its document a dead letter naming it, as a chunked job's document cut into too many
chunks is); the others become token batches of pixels: runs of consecutive rows of the job batch (a
given-up document ends one), each small enough that its message fits the server's max_payload with its
documents' ids. The same batch prepared again (delivered again) makes the same token batches. No NATS here.

``prepare_rows``, ``consecutive_runs`` and ``ImageRun`` are what a page model's batch (bulk_pages.py)
shares with this one: the images prepared one at a time, the runs, what a token batch of them carries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from embedfleet.services.tokenizer.images import ImagePreparer
from embedfleet.shared.images.decode import ImageError
from embedfleet.shared.protocol import JobBatch

# bytes a row adds to a token batch besides its pixels and its document id: msgpack's header of the id,
# its cumulative length (int32)
ROW_BYTES = 16

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ImageRun:
    """What one token batch of a job batch's images carries: rows ``first`` .. ``first + count`` of the job
    batch, as ``input_ids`` [T] / ``cu_seqlens`` [count + 1] int32, and either ``pixels`` [count, C, H, W]
    uint8 (a two-tower model's) or ``pages`` [P, width] uint8 patch rows with ``page_grids`` [count, 2]
    int32 (a page model's)."""

    first: int
    count: int
    input_ids: np.ndarray
    cu_seqlens: np.ndarray
    pixels: np.ndarray | None = None
    pages: np.ndarray | None = None
    page_grids: np.ndarray | None = None


def prepare_rows(prepare: Callable[[bytes], T], job: JobBatch) -> tuple[list[T], list[int], list[tuple[int, str]]]:
    """Every image of ``job`` through ``prepare``: (what it made, the rows it made them of, ascending; the
    rows given up, with why, naming the document), an ImageError giving up its row alone."""
    assert job.images is not None  # a batch of images
    made: list[T] = []
    rows: list[int] = []
    failed: list[tuple[int, str]] = []
    for row, data in enumerate(job.images):
        try:
            made.append(prepare(data))
            rows.append(row)
        except ImageError as exc:
            failed.append((row, f"document {job.doc_ids[row][:200]!r}: {exc}"))
    return made, rows, failed


def consecutive_runs(
    rows: Sequence[int], costs: Sequence[int], max_bytes: int, max_rows: int
) -> Iterator[tuple[int, int]]:
    """[lo, hi) into ``rows`` (the job batch's rows prepared, ascending; ``costs[i]`` the bytes row ``i``
    adds to a token batch) for each token batch: consecutive rows of the job batch, at most ``max_rows``
    of them and ``max_bytes`` (a row alone may pass it: the caller's check of the message's size refuses
    that batch)."""
    lo, n = 0, len(rows)
    while lo < n:
        hi, size = lo, 0
        while hi < n and hi - lo < max_rows:
            consecutive = hi == lo or rows[hi] == rows[hi - 1] + 1
            if hi > lo and (not consecutive or size + costs[hi] > max_bytes):
                break
            size, hi = size + costs[hi], hi + 1
        yield lo, hi
        lo = hi


@dataclass(frozen=True, slots=True)
class PreparedImages:
    """A job batch's images that were prepared: ``pixels`` [n, C, H, W] uint8, the image of row ``rows[i]``
    of the batch at ``i`` (rows ascending); and the rows given up, with why."""

    pixels: np.ndarray
    rows: list[int]
    failed: list[tuple[int, str]]
    tokens: int = 0  # what one image counts as: the tokens its tower runs (metrics, the workers' budgets)

    @property
    def counted(self) -> list[list[int]]:
        """Each image as the tokens it counts as (the tokenizer's metrics)."""
        return [[0] * self.tokens] * len(self.rows)

    def runs(self, doc_ids: list[str], max_bytes: int, max_rows: int) -> Iterator[ImageRun]:
        """The token batches of pixels (``image_runs``)."""
        for lo, hi in image_runs(self, doc_ids, max_bytes, max_rows):
            cu = (np.arange(hi - lo + 1, dtype=np.int32) * self.tokens).astype(np.int32)
            yield ImageRun(self.rows[lo], hi - lo, np.zeros(0, np.int32), cu, pixels=self.pixels[lo:hi])


def prepare_batch(preparer: ImagePreparer, job: JobBatch) -> PreparedImages:
    """Every image of ``job`` prepared, or given up naming its document."""
    pixels, rows, failed = prepare_rows(preparer.pixels, job)
    stacked = np.stack(pixels) if pixels else np.zeros((0, 3, *preparer.processing.output_size), np.uint8)
    return PreparedImages(stacked, rows, failed, preparer.tokens)


def image_runs(
    prepared: PreparedImages, doc_ids: list[str], max_bytes: int, max_rows: int
) -> Iterator[tuple[int, int]]:
    """[lo, hi) into ``prepared``'s images for each token batch: consecutive rows of the job batch, at
    most ``max_rows`` of them and ``max_bytes`` of pixels and ids (an image alone may pass it: the
    caller's check of the message's size refuses that batch)."""
    each = int(np.prod(prepared.pixels.shape[1:]))
    costs = [each + len(doc_ids[row].encode()) + ROW_BYTES for row in prepared.rows]
    return consecutive_runs(prepared.rows, costs, max_bytes, max_rows)
