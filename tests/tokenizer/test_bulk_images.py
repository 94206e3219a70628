"""A job batch of images in the tokenizer (services/tokenizer/bulk_images.py): each image prepared as the
online path prepares it, one that is refused or cannot be decoded given up alone naming its document,
the others in token batches of consecutive rows within a message's bytes and the rows a batch may hold."""

from __future__ import annotations

import numpy as np
import pytest

from embedfleet.services.tokenizer.bulk_images import image_runs, prepare_batch
from embedfleet.services.tokenizer.images import ImagePreparer
from embedfleet.shared.images.decode import ImageLimits
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.protocol import JobBatch
from tests.support.image_files import animated_gif, encoded, huge_png_header, noise
from tests.support.image_models import build_clip


@pytest.fixture(scope="module")
def preparer(tmp_path_factory) -> ImagePreparer:
    found = ImagePreparer.for_model(
        load_model_info(str(build_clip(tmp_path_factory.mktemp("clip")))), ImageLimits(max_pixels=1_000_000)
    )
    assert found is not None
    return found


def test_each_image_is_prepared_and_a_bad_one_is_given_up_alone(preparer):
    rng = np.random.default_rng(0)
    good = [encoded(noise(side, side, rng)) for side in (20, 33, 48)]
    whole = encoded(noise(40, 40, rng))
    files = [good[0], whole[:200], good[1], animated_gif(), huge_png_header(2000, 2000), good[2]]
    job = JobBatch("j", 0, "clip", [f"d{i}" for i in range(6)], [], images=files)
    prepared = prepare_batch(preparer, job)
    assert prepared.rows == [0, 2, 5] and prepared.pixels.shape == (3, 3, 32, 32)
    np.testing.assert_array_equal(prepared.pixels, preparer.prepare(good))  # as the online path prepares them
    assert [row for row, _ in prepared.failed] == [1, 3, 4]
    reasons = dict(prepared.failed)
    assert reasons[1].startswith("document 'd1': the PNG image cannot be decoded")
    assert reasons[3] == "document 'd3': the GIF image is animated: send a still image (one frame)"
    assert reasons[4].startswith("document 'd4': the image is 2000x2000 = 4000000 pixels, over the limit of 1000000")
    nothing = prepare_batch(preparer, JobBatch("j", 0, "clip", ["x"], [], images=[b"junk"]))
    assert nothing.rows == [] and nothing.pixels.shape == (0, 3, 32, 32) and len(nothing.failed) == 1


def test_token_batches_are_runs_of_consecutive_rows_within_bytes_and_rows(preparer):
    rng = np.random.default_rng(1)
    files = [encoded(noise(32, 32, rng)) for _ in range(9)]
    files[4] = b"\x89PNG\r\n\x1a\n broken"
    job = JobBatch("j", 0, "clip", [f"d{i}" for i in range(9)], [], images=files)
    prepared = prepare_batch(preparer, job)  # rows 0-3 and 5-8
    each = 3 * 32 * 32 + 2 + 16  # its pixels, its id, its row's overhead
    runs = list(image_runs(prepared, job.doc_ids, 10 * each, 256))
    assert [[prepared.rows[i] for i in range(lo, hi)] for lo, hi in runs] == [[0, 1, 2, 3], [5, 6, 7, 8]]
    assert list(image_runs(prepared, job.doc_ids, 3 * each, 256)) == [(0, 3), (3, 4), (4, 7), (7, 8)]
    assert list(image_runs(prepared, job.doc_ids, 10 * each, 2)) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert list(image_runs(prepared, job.doc_ids, 1, 256)) == [(i, i + 1) for i in range(8)]  # one alone passes
