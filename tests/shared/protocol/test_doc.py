"""docs/protocol.md against the codec: each message's table lists exactly the keys encode() writes (and
which are always there), each key is in the key index once, and the version section names the version written."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import msgpack
import numpy as np
import pytest

from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol import (
    VERSION,
    Cancel,
    ChunkLayout,
    ChunkRequest,
    ChunkRows,
    DecodeRequest,
    DecodeResult,
    EmbedOptions,
    EmbedRequest,
    EmbedResult,
    ErrorReply,
    Held,
    JobBatch,
    JobResult,
    LoadReport,
    Replies,
    Requests,
    RerankRequest,
    RerankResult,
    Spans,
    TokenChunk,
    TokenizeRequest,
    TokenizeResult,
    encode,
)
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking, TextChunk

DOC = (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text()
IDS, CU = np.array([1, 2, 3], "<i4"), np.array([0, 1, 3], "<i4")
SPARSE = EmbedOptions(output="sparse", sparse_top_k=4, sparse_threshold=0.1)
SPARSE_PART = dict(dim=8, dtype="f4", data=np.zeros(3, "<f4").tobytes(), offsets=CU, indices=IDS)
VECTORS = np.zeros((2, 3), "<f4")
SPANS = EmbedOptions(output="spans", truncate=False)
KEY = bytes(16)  # a cancel key
CHUNK_ROWS = ChunkRows.of(1, [(0, 0, 2, 0, 4), (0, 1, 2, 3, 9)], ["abcd", "defghi"])

# per message: (the fewest keys it can have, every key it can have)
EXAMPLES = {
    EmbedRequest: (
        EmbedRequest("r", "m", ["a"], 1.0),
        EmbedRequest(
            "r",
            "m",
            [],
            1.0,
            SPANS,
            token_ids=[IDS],
            pairs=[("q", "d")],
            held=True,
            replies=True,
            spans=Spans.of([[(0, 1)]], [1]),
            cancel_key=KEY,
            images=[b"\x89PNG"],
            avoid=("w",),
        ),
    ),
    TokenChunk: (
        TokenChunk("r", "m", 0, 2, IDS, CU, 1.0),
        TokenChunk(
            "r",
            "m",
            0,
            2,
            IDS,
            CU,
            1.0,
            SPANS,
            token_types=IDS,
            job="j",
            batch=1,
            doc_ids=["a", "a"],
            prompt_tokens=1,
            held=True,
            replies=True,
            spans=Spans.of([[(0, 1)], [(0, 2)]]),
            chunks=CHUNK_ROWS,
            cancel_key=KEY,
            pixels=np.zeros((2, 3, 4, 4), np.uint8),
            pages=np.zeros((8, 12), np.uint8),  # every key at once, for the table (a decoder refuses both)
            page_grids=np.array([[2, 2], [2, 2]], np.int32),
        ),
    ),
    EmbedResult: (
        EmbedResult("r", 0, 1, 2, "f4", np.zeros(2, "<f4").tobytes(), 3),
        EmbedResult("r", 0, 2, tokens=3, **SPARSE_PART),
    ),
    ErrorReply: (ErrorReply("r", ErrorCode.TIMEOUT, "late"), ErrorReply("r", ErrorCode.INVALID_REQUEST, "long", row=2)),
    Held: (Held("r", 0, 2, "w"),) * 2,
    Cancel: (Cancel("r", KEY, 1.0),) * 2,
    Replies: (Replies(["_INBOX.g.r"], [b"\x80"]),) * 2,
    Requests: (Requests(["_INBOX.g.r"], [""], [b"\x80"]),) * 2,
    TokenizeRequest: (TokenizeRequest("r", "m", ["a"]),) * 2,
    TokenizeResult: (TokenizeResult("r", [[(1, "a", False, 0, 1)]]),) * 2,
    DecodeRequest: (DecodeRequest("r", "m", [IDS]),) * 2,
    DecodeResult: (DecodeResult("r", ["a"]),) * 2,
    ChunkRequest: (ChunkRequest("r", "m", ["a"], ChunkSpec(8)),) * 2,
    ChunkLayout: (
        ChunkLayout.of("r", [[TextChunk(0, 1, 0, 1)]], [1]),
        ChunkLayout.of("r", [[TextChunk(0, 1, 0, 1)]], [1], 254),
    ),
    JobBatch: (
        JobBatch("j", 0, "m", ["a"], ["text"]),
        JobBatch("j", 0, "m", ["a"], ["text"], chunking=JobChunking(ChunkSpec(8, 2), with_text=True), images=[b"i"]),
    ),
    JobResult: (
        JobResult("j", 0, 0, ["a"], 2, "f4", np.zeros(2, "<f4").tobytes(), 3),
        JobResult("j", 0, 0, ["a", "b"], tokens=3, chunks=CHUNK_ROWS, **SPARSE_PART),
    ),
    LoadReport: (LoadReport("w", "m", "sub", 0, 0.05),) * 2,
    RerankRequest: (RerankRequest("r", "m", "q", ["a"], 1.0), RerankRequest("r", "m", "q", [], 1.0, vectors=VECTORS)),
    RerankResult: (
        RerankResult("r", IDS, np.zeros(3, "<f4")),
        RerankResult("r", IDS, np.zeros(3, "<f4"), ["a", "b", "c"]),
    ),
}


def _section(heading: str) -> str:
    """The text under the first heading that starts with ``heading``, up to the next heading."""
    match = re.search(rf"^#+ {re.escape(heading)}.*?\n(.*?)(?=^#)", DOC + "\n#", re.S | re.M)
    assert match, f"docs/protocol.md has no section {heading!r}"
    return match.group(1)


def _rows(text: str) -> list[list[str]]:
    """Table rows (header and rule left out), cells stripped of their backticks."""
    lines = [line for line in text.splitlines() if line.startswith("|")][2:]
    return [[cell.strip().strip("`") for cell in line.strip("|").split("|")] for line in lines]


def _table(heading: str) -> dict[str, tuple[str, str]]:
    """key -> (field, when present), from a message's table."""
    rows = _rows(_section(heading))
    table = {key: (field, present) for key, field, present in rows}
    assert len(table) == len(rows), f"a key twice in {heading}"
    return table


def _keys(msg) -> set[str]:
    return set(msgpack.unpackb(encode(msg))) - {"v", "t"}


@pytest.mark.parametrize("kind", EXAMPLES, ids=lambda k: k.__name__)
def test_each_message_table_lists_the_keys_the_codec_writes(kind):
    fewest, every = EXAMPLES[kind]
    table = _table(f"{kind.__name__} (`{kind.TYPE}`)")
    assert set(table) == _keys(every)
    assert {key for key, (_, present) in table.items() if present.startswith("always")} == _keys(fewest)
    assert {field for field, _ in table.values()} <= {f.name for f in dataclasses.fields(kind)}


def test_the_options_table_lists_the_keys_the_codec_writes():
    table = _table("EmbedOptions")
    assert set(table) == set(SPARSE.to_wire())
    assert {key for key, (_, present) in table.items() if present == "always"} == set(EmbedOptions().to_wire())
    assert {field for field, _ in table.values()} <= {f.name for f in dataclasses.fields(EmbedOptions)}


def test_every_key_has_one_meaning_in_the_index():
    index = [row[0] for row in _rows(_section("Key index"))]
    assert len(index) == len(set(index)), sorted(k for k in index if index.count(k) > 1)
    used = {key for kind in EXAMPLES for key in _table(f"{kind.__name__} (`{kind.TYPE}`)")} | set(
        _table("EmbedOptions")
    )
    assert set(index) == used | {"v", "t"}


def test_the_version_section_names_the_version_written():
    section = _section("Versions")
    assert f"writes and\nreads version {VERSION}" in section and f"reads v{VERSION};" in section
