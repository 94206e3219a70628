"""A page model's rows on the wire (ColQwen2): a TokenChunk's token ids with each row's image as uint8 patch
rows and its (gh, gw) grid round-trip, and a forged message is refused before its patches are copied (bytes
against the grids, one grid per row, the row width, grid sides, pixels beside them)."""

from __future__ import annotations

import re

import msgpack
import numpy as np
import pytest

from embedfleet.shared.protocol import ProtocolError, TokenChunk, decode_as, encode

WIDTH = 3 * 14 * 14  # a patch row: channels x patch x patch
GRIDS = np.array([[2, 2], [4, 6]], np.int32)  # 4 and 24 patches: 1 and 6 image tokens
PATCHES = (np.arange(28 * WIDTH) % 251).astype(np.uint8).reshape(28, WIDTH)
IDS = np.array([5, 9, 7, 6, 9, 9, 9, 9, 9, 9, 8], np.int32)  # 9: the image token
CU = np.array([0, 4, 11], np.int32)


def _chunk(**changes) -> TokenChunk:
    fields = dict(
        id="r",
        model="m",
        start=0,
        total=2,
        input_ids=IDS,
        cu_seqlens=CU,
        deadline=1.0,
        pages=PATCHES,
        page_grids=GRIDS,
    )
    return TokenChunk(**{**fields, **changes})


def _forged(**keys) -> bytes:
    body = msgpack.unpackb(encode(_chunk()), raw=False)
    body.update(keys)
    return msgpack.packb({k: v for k, v in body.items() if v is not None}, use_bin_type=True)


def test_pages_round_trip_and_slice_by_row():
    chunk = decode_as(encode(_chunk()), TokenChunk)
    np.testing.assert_array_equal(chunk.pages, PATCHES)
    np.testing.assert_array_equal(chunk.page_grids, GRIDS)
    np.testing.assert_array_equal(chunk.input_ids, IDS)
    patches, grids = chunk.page_rows(1, 2)  # the second row's image: the 24 patches after the first's 4
    np.testing.assert_array_equal(patches, PATCHES[4:])
    np.testing.assert_array_equal(grids, GRIDS[1:])
    assert chunk.page_rows(0, 1)[0].shape == (4, WIDTH)


def _grids(*pairs: int) -> bytes:
    return np.array(pairs, "<i4").tobytes()


@pytest.mark.parametrize(
    ("keys", "why"),
    [
        ({"pg": PATCHES.tobytes()[:-1]}, "exactly their grids' patch rows"),
        ({"pgg": _grids(2, 2, 4, 7)}, "exactly their grids' patch rows"),
        ({"pgg": _grids(2, 2)}, "one \\(height, width\\) grid per row"),
        ({"pgg": _grids(2, 2, 4, 6, 1, 1)}, "one \\(height, width\\) grid per row"),
        ({"pgg": _grids(2, 2, 0, 6)}, "1 to 4096 patches"),
        ({"pgg": _grids(2, 2, -4, -6)}, "1 to 4096 patches"),
        ({"pgg": _grids(1, 1, 5000, 1)}, "1 to 4096 patches"),
        ({"pgw": 0}, "patch rows of 1 to"),
        ({"pgw": 5000}, "patch rows of 1 to"),
        ({"pgw": "588"}, "pgw"),
        ({"pgg": None}, "pgg"),
        ({"pgw": None}, "pgw"),
        ({"px": bytes(48), "pxs": [2, 3, 2, 4], "ids": b"", "cu": np.array([0, 5, 10], "<i4").tobytes()}, "pixels"),
    ],
)
def test_forged_page_chunks_are_refused(keys, why):
    with pytest.raises(ProtocolError, match=why):
        decode_as(_forged(**keys), TokenChunk)


def test_patch_image_rows_round_trip_each_row_counted_as_its_patches():
    """A NaFlex model's image rows (SigLIP 2): patch rows and a grid each, no token ids, cu_seqlens counting patches."""
    chunk = _chunk(input_ids=np.zeros(0, np.int32), cu_seqlens=np.array([0, 4, 28], np.int32))
    back = decode_as(encode(chunk), TokenChunk)
    assert back.image_rows and back.count == 2 and back.num_tokens == 28
    assert np.array_equal(back.pages, PATCHES) and np.array_equal(back.page_grids, GRIDS)
    assert not _chunk().image_rows  # a page model's rows are token rows


@pytest.mark.parametrize(
    ("cu", "says"),
    [
        (np.array([0, 5, 28], np.int32), "counts its grid's patches"),  # 5 for a 2x2 grid
        (np.array([0, 4, 27], np.int32), "counts its grid's patches"),  # short of the second image's 24
        (np.array([0, 28], np.int32), "one (height, width) grid per row"),  # one row, two grids
    ],
)
def test_forged_patch_image_rows_are_refused(cu, says):
    forged = _forged(ids=b"", cu=cu.tobytes())
    with pytest.raises(ProtocolError, match=re.escape(says)):
        decode_as(forged, TokenChunk)
