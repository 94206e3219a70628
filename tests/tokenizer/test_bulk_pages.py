"""A job batch of page images in the tokenizer (services/tokenizer/bulk_pages.py): each page prepared as the
online path prepares it, one that is refused, cannot be decoded or alone overflows a token batch given up
alone naming its document, the others in token batches of consecutive rows within a message's bytes and
the rows a batch may hold, the same batch making the same token batches again."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from embedfleet.services.tokenizer.bulk_pages import page_bytes, page_runs, prepare_pages
from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.services.tokenizer.pages import PagePreparer, pack_pages
from embedfleet.shared.images.decode import ImageLimits
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.protocol import JobBatch, TokenChunk, decode_as, encode
from tests.support.image_files import animated_gif, encoded, huge_png_header, noise
from tests.support.page_models import build_colqwen2

ROOM = 1 << 20  # a token batch's room in these tests: every page of them fits alone


@pytest.fixture(scope="module")
def preparer(tmp_path_factory) -> PagePreparer:
    info = load_model_info(str(build_colqwen2(tmp_path_factory.mktemp("colqwen2"))))
    found = PagePreparer.for_model(info, TextEncoder(info), ImageLimits(max_pixels=1_000_000))
    assert found is not None
    return found


def _files(sides: list[tuple[int, int]], seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [encoded(noise(w, h, rng)) for w, h in sides]


def test_each_page_is_prepared_as_online_and_a_bad_one_is_given_up_alone(preparer):
    good = _files([(120, 160), (300, 90), (40, 40)], seed=0)
    whole = encoded(noise(60, 60, np.random.default_rng(1)))
    files = [
        good[0],
        whole[: len(whole) // 2],
        good[1],
        animated_gif(),
        huge_png_header(2000, 2000),
        encoded(Image.new("RGB", (2010, 10))),  # an aspect ratio over 200: the processor refuses it
        good[2],
    ]
    job = JobBatch("j", 0, "colqwen2", [f"d{i}" for i in range(len(files))], [], images=files)
    prepared = prepare_pages(preparer, job, ROOM)
    assert prepared.rows == [0, 2, 6]
    online = preparer.prepare(good)  # what /embed_all's pages become
    assert isinstance(online, list)
    for ours, theirs in zip(prepared.pages, online, strict=True):
        np.testing.assert_array_equal(ours.ids, theirs.ids)
        np.testing.assert_array_equal(ours.patches, theirs.patches)
        assert ours.grid == theirs.grid
    assert [len(p.ids) for p in prepared.pages] == [len(p.ids) for p in online]
    assert len({p.grid for p in prepared.pages}) == 3  # sized by their content: three grids
    assert [row for row, _ in prepared.failed] == [1, 3, 4, 5]
    reasons = dict(prepared.failed)
    assert reasons[1].startswith("document 'd1': the PNG image cannot be decoded"), reasons[1]
    assert reasons[3] == "document 'd3': the GIF image is animated: send a still image (one frame)"
    assert reasons[4].startswith("document 'd4': the image is 2000x2000 = 4000000 pixels, over the limit of 1000000")
    assert reasons[5].startswith("document 'd5': ") and "aspect ratio" in reasons[5], reasons[5]
    assert prepared.counted == [p.ids.tolist() for p in online]
    nothing = prepare_pages(preparer, JobBatch("j", 0, "colqwen2", ["x"], [], images=[b"junk"]), ROOM)
    assert nothing.rows == [] and nothing.pages == [] and len(nothing.failed) == 1
    assert list(nothing.runs(["x"], ROOM, 16)) == []


def test_a_page_no_token_batch_can_carry_is_given_up_alone(preparer):
    files = _files([(40, 40), (224, 224), (40, 40)], seed=2)
    job = JobBatch("j", 3, "colqwen2", ["small", "large", "small-too"], [], images=files)
    sizes = [page_bytes(preparer.page(f), d) for f, d in zip(files, job.doc_ids)]
    room = max(sizes[0], sizes[2])  # the large page alone is over it
    assert sizes[1] > room
    prepared = prepare_pages(preparer, job, room)
    assert prepared.rows == [0, 2]
    ((row, why),) = prepared.failed
    assert row == 1 and why.startswith(f"document 'large': its page takes {sizes[1]:,} bytes as patches"), why
    assert f"({room:,} bytes in a message" in why and "max_payload" in why
    # the two others are a token batch each: not consecutive rows of the job batch
    assert [(run.first, run.count) for run in prepared.runs(job.doc_ids, ROOM, 16)] == [(0, 1), (2, 1)]


def test_token_batches_are_runs_of_consecutive_rows_within_bytes_and_rows(preparer):
    sides = [(40 + 19 * i, 200 - 13 * i) for i in range(9)]  # pages of several sizes
    files = _files(sides, seed=3)
    files[4] = b"\x89PNG\r\n\x1a\n broken"
    job = JobBatch("j", 0, "colqwen2", [f"d{i}" for i in range(9)], [], images=files)
    prepared = prepare_pages(preparer, job, ROOM)  # rows 0-3 and 5-8
    costs = [page_bytes(p, job.doc_ids[r]) for p, r in zip(prepared.pages, prepared.rows)]
    assert len(set(costs)) > 1
    runs = list(page_runs(prepared, job.doc_ids, ROOM, 256))
    assert [[prepared.rows[i] for i in range(lo, hi)] for lo, hi in runs] == [[0, 1, 2, 3], [5, 6, 7, 8]]
    assert list(page_runs(prepared, job.doc_ids, ROOM, 3)) == [(0, 3), (3, 4), (4, 7), (7, 8)]
    assert list(page_runs(prepared, job.doc_ids, 1, 256)) == [(i, i + 1) for i in range(8)]  # one alone passes
    tight = sum(costs[:2]) + costs[2] // 2  # two pages fit, not three
    cut = list(page_runs(prepared, job.doc_ids, tight, 256))
    assert cut[0] == (0, 2) and all(hi - lo == 1 or sum(costs[lo:hi]) <= tight for lo, hi in cut), cut
    assert [i for lo, hi in cut for i in range(lo, hi)] == list(range(8))  # each page once, in order


def test_a_run_is_the_online_path_s_packing_and_its_message_fits(preparer):
    """Each run packed as the online path packs a chunk of pages (pack_pages), its TokenChunk's message
    within the run's bytes and a small envelope, read back whole; the same batch again makes the same runs."""
    files = _files([(50 + 23 * i, 150 - 9 * i) for i in range(7)], seed=4)
    job = JobBatch("job", 2, "colqwen2", [f"doc-{i}" for i in range(7)], [], images=files)
    prepared = prepare_pages(preparer, job, ROOM)
    room = sum(page_bytes(p, d) for p, d in zip(prepared.pages[:3], job.doc_ids))
    runs = list(prepared.runs(job.doc_ids, room, 256))
    assert (runs[0].first, runs[0].count) == (0, 3) and len(runs) > 2
    assert [run.first + i for run in runs for i in range(run.count)] == list(range(7))  # each page once, in order
    for run in runs:
        ids, cu, patches, grids = pack_pages(prepared.pages[run.first : run.first + run.count])
        np.testing.assert_array_equal(run.input_ids, ids)
        np.testing.assert_array_equal(run.cu_seqlens, cu)
        np.testing.assert_array_equal(run.pages, patches)
        np.testing.assert_array_equal(run.page_grids, grids)
        assert run.pixels is None
        doc_ids = job.doc_ids[run.first : run.first + run.count]
        chunk = TokenChunk(
            "job.2", "colqwen2", run.first, job.count, run.input_ids, run.cu_seqlens, 0.0, job="job", batch=2,
            doc_ids=doc_ids, pages=run.pages, page_grids=run.page_grids,
        )  # fmt: skip
        data = encode(chunk)
        rows = sum(page_bytes(p, d) for p, d in zip(prepared.pages[run.first : run.first + run.count], doc_ids))
        assert run.count == 1 or rows <= room, (rows, room)
        assert len(data) <= rows + 512, (len(data), rows)
        back = decode_as(data, TokenChunk)
        np.testing.assert_array_equal(back.pages, run.pages)
        np.testing.assert_array_equal(back.page_grids, run.page_grids)
        assert back.doc_ids == doc_ids
    again = list(prepare_pages(preparer, job, ROOM).runs(job.doc_ids, room, 256))
    assert [(r.first, r.count) for r in again] == [(r.first, r.count) for r in runs]
    for a, b in zip(again, runs, strict=True):
        assert a.pages is not None and b.pages is not None
        assert a.input_ids.tobytes() == b.input_ids.tobytes() and a.pages.tobytes() == b.pages.tobytes()
