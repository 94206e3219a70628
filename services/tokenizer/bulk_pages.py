"""A job batch of page images in the tokenizer (a page model's, ColQwen2's): each document's file decoded,
resized and cut into patch rows as the online path prepares a page (services/tokenizer/pages.py), its row
the page prompt with its image token repeated once per merge window, one at a time under the tokenizer's
own --max-image-bytes and --max-image-pixels. As for a two-tower model's images (bulk_images.py), whose
machinery this shares: an image that is refused or cannot be decoded is given up alone, its document a
dead letter naming it, and so is a page whose patch rows alone overflow a token batch's message; the
others become token batches carrying ``pages`` and ``page_grids``, runs of consecutive rows of the job
batch each within the message's bytes. Pages are sized by their content, so the runs are cut by each
page's own bytes; the same batch prepared again (delivered again) makes the same token batches. No NATS here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from embedfleet.services.tokenizer.bulk_images import ROW_BYTES, ImageRun, consecutive_runs, prepare_rows
from embedfleet.services.tokenizer.pages import Page, PagePreparer, pack_pages
from embedfleet.shared.protocol import JobBatch

# bytes a page's row adds to a token batch besides its patch rows, its ids and its document id: ROW_BYTES
# and its grid (two int32)
_PAGE_ROW_BYTES = ROW_BYTES + 8


def page_bytes(page: Page, doc_id: str) -> int:
    """The bytes ``page`` adds to a token batch, as row of document ``doc_id``."""
    return page.patches.nbytes + page.ids.nbytes + len(doc_id.encode()) + _PAGE_ROW_BYTES


@dataclass(frozen=True, slots=True)
class PreparedPages:
    """A job batch's pages that were prepared, the page of row ``rows[i]`` of the batch at ``i`` (rows
    ascending), and the rows given up, with why."""

    pages: list[Page]
    rows: list[int]
    failed: list[tuple[int, str]]

    @property
    def counted(self) -> list[list[int]]:
        """Each page's row of token ids (the tokenizer's metrics)."""
        return [page.counted.tolist() for page in self.pages]

    def runs(self, doc_ids: list[str], max_bytes: int, max_rows: int) -> Iterator[ImageRun]:
        """The token batches of pages (``page_runs``), each packed as the online path packs its chunks."""
        for lo, hi in page_runs(self, doc_ids, max_bytes, max_rows):
            ids, cu, patches, grids = pack_pages(self.pages[lo:hi])
            yield ImageRun(self.rows[lo], hi - lo, ids, cu, pages=patches, page_grids=grids)


def prepare_pages(preparer: PagePreparer, job: JobBatch, max_bytes: int) -> PreparedPages:
    """Every image of ``job`` prepared as a page, or given up naming its document: one that cannot be
    decoded or that the processor refuses, and one whose row alone takes more than ``max_bytes`` (what
    a token batch's message holds besides its envelope), which no token batch could carry."""
    pages, rows, failed = prepare_rows(preparer.page, job)
    kept = []
    for i, (page, row) in enumerate(zip(pages, rows)):
        size = page_bytes(page, job.doc_ids[row])
        if size <= max_bytes:
            kept.append(i)
            continue
        why = (
            f"its page takes {size:,} bytes as patches, more than one token batch can carry ({max_bytes:,} "
            "bytes in a message of the NATS server's max_payload): make the image smaller, or raise max_payload"
        )
        failed.append((row, f"document {job.doc_ids[row][:200]!r}: {why}"))
    failed.sort()
    return PreparedPages([pages[i] for i in kept], [rows[i] for i in kept], failed)


def page_runs(prepared: PreparedPages, doc_ids: list[str], max_bytes: int, max_rows: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) into ``prepared``'s pages for each token batch: consecutive rows of the job batch, at most
    ``max_rows`` of them and ``max_bytes`` of patch rows, ids and document ids."""
    costs = [page_bytes(page, doc_ids[row]) for page, row in zip(prepared.pages, prepared.rows)]
    return consecutive_runs(prepared.rows, costs, max_bytes, max_rows)
