"""services/tokenizer/bulk_chunks.py: a chunked job batch's rows are its documents' chunks, each
sequence the model's tokenization of the chunk's text (with the prompt before it), made from the
document's tokens without tokenizing the chunk again; a document cut into too many chunks is given up
alone; rows are packed within tokens, rows and bytes (no NATS here; on the stack:
tests/integration/test_job_chunks.py). Late chunking: a sequence a window of a document's chunks, the
chunks it owns its spans, the rows the same chunks as plain chunking's."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from embedfleet.services.tokenizer.bulk_chunks import BatchCutter, pack_rows
from embedfleet.services.tokenizer.chunking import cut as cut_text
from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.shared.chunk_windows import late_windows
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.protocol import EmbedOptions, JobBatch
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking
from tests.support.corpus import mixed_texts

PROMPTS = {"query": "query: "}


@pytest.fixture(scope="module")
def encoder(model_info) -> TextEncoder:
    return TextEncoder(model_info, PROMPTS)


def _job(texts: list[str], chunking: JobChunking, options: EmbedOptions = EmbedOptions()) -> JobBatch:
    return JobBatch("j", 3, "all-MiniLM-L6-v2", [f"d{i}" for i in range(len(texts))], texts, options, chunking)


@pytest.mark.parametrize("options", [EmbedOptions(), EmbedOptions(input_type="query")], ids=["plain", "prompt"])
def test_each_row_is_the_models_sequence_for_its_chunks_text(encoder, options):
    texts = [*mixed_texts(48), "", "one line"]
    job = _job(texts, JobChunking(ChunkSpec(60, 10, "sentence"), with_text=True), options)
    cut = BatchCutter(encoder, 1024).cut(job)
    chunks = cut.chunks
    assert not cut.failed and chunks.documents == len(texts) and len(cut.sequences) == len(chunks) > len(texts)
    pieces = [texts[d][s:e] for d, s, e in zip(chunks.doc.tolist(), chunks.start.tolist(), chunks.end.tolist())]
    assert cut.sequences == encoder.encode(encoder.with_prompt(pieces, options), truncate=False)
    assert chunks.texts == pieces and cut.doc_ids == [f"d{d}" for d in chunks.doc.tolist()]
    for d in range(len(texts)):  # a document's chunks one after another, 0 .. n - 1, each saying n
        mine = [
            (k, n) for doc, k, n in zip(chunks.doc.tolist(), chunks.chunk.tolist(), chunks.count.tolist()) if doc == d
        ]
        assert mine == [(k, len(mine)) for k in range(len(mine))]
    assert max(len(s) for s in cut.sequences) <= encoder.max_length


def test_a_document_over_max_chunks_is_given_up_alone(encoder):
    cut = BatchCutter(encoder, 5).cut(_job(["short", " ".join(["word"] * 6), "also short"], JobChunking(ChunkSpec(1))))
    assert cut.failed == [
        (
            1,
            (
                "document 'd1' is cut into 6 chunks, over the 5 a document may be (the tokenizer's "
                "--max-chunks): give a larger chunk size, or cut the document"
            ),
        )
    ]
    assert cut.doc_ids == ["d0", "d2", "d2"] and cut.chunks.documents == 3 and cut.chunks.texts is None


@pytest.mark.parametrize("late", [False, True], ids=["plain", "late"])
@pytest.mark.parametrize(
    "chunking, said",
    [
        (JobChunking(ChunkSpec(255)), "chunking.size is 255; this model holds at most 254 tokens of text a chunk"),
    ],
)
def test_what_no_document_can_be_cut_for_gives_the_batch_up(encoder, chunking, said, late):
    with pytest.raises(ServiceError) as caught:
        BatchCutter(encoder, 1024).cut(_job(["text"], replace(chunking, late=late)))
    assert caught.value.code == ErrorCode.INVALID_REQUEST and said in caught.value.message


def test_rows_are_packed_within_tokens_rows_and_bytes(encoder):
    cut = BatchCutter(encoder, 1024).cut(_job(mixed_texts(40), JobChunking(ChunkSpec(32), with_text=True)))
    for limits in [(256, 256, 1 << 20), (4096, 5, 1 << 20), (4096, 256, 8000)]:
        parts = list(pack_rows(cut, *limits, 1536))
        assert parts[0][0] == 0 and parts[-1][1] == len(cut.sequences)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(parts))  # in order, every row once
        tokens, seqs, size = limits
        for lo, hi in parts:
            assert hi - lo <= seqs and (hi - lo == 1 or sum(len(s) for s in cut.sequences[lo:hi]) <= tokens)
            cost = sum(1536 + len(cut.doc_ids[i]) + len(cut.chunks.texts[i].encode()) for i in range(lo, hi))
            assert hi - lo == 1 or cost <= size
    assert len(list(pack_rows(cut, 4096, 256, 8000, 1536))) > len(list(pack_rows(cut, 4096, 256, 1 << 20, 1536)))


def _windows(encoder: TextEncoder, texts: list[str], spec: ChunkSpec, options: EmbedOptions) -> list[str]:
    """Each document's late windows' texts, as shared/chunk_windows.py places them over its chunks."""
    whole = encoder.whole_text_tokenizer()
    out = []
    for text in texts:
        chunks = cut_text(text, whole.encode(text, add_special_tokens=False), spec)
        out += [
            text[chunks[w.first].start : chunks[w.end - 1].end] for w in late_windows(chunks, encoder.room(options))
        ]
    return out


@pytest.mark.parametrize("options", [EmbedOptions(), EmbedOptions(input_type="query")], ids=["plain", "prompt"])
def test_late_rows_are_windows_with_the_chunks_they_own_as_spans(encoder, options):
    # one document of several windows, short ones of one window each, one of no tokens
    texts = [" ".join(mixed_texts(40)), *mixed_texts(6), "", "one line"]
    spec = ChunkSpec(60, 10, "sentence")
    plain = BatchCutter(encoder, 1024).cut(_job(texts, JobChunking(spec, with_text=True), options))
    late = BatchCutter(encoder, 1024).cut(_job(texts, JobChunking(spec, late=True, with_text=True), options))
    # the rows are plain chunking's chunks, in the same order, with the same ids, offsets and texts
    assert late.doc_ids == plain.doc_ids and late.chunks.texts == plain.chunks.texts and late.rows == plain.rows
    for name in ("doc", "chunk", "count", "start", "end"):
        assert getattr(late.chunks, name).tolist() == getattr(plain.chunks, name).tolist(), name
    # a sequence a window: the model's sequence for the window's text (no tokenizing here: a slice)
    assert late.sequences == encoder.encode(
        encoder.with_prompt(_windows(encoder, texts, spec, options), options), truncate=False
    )
    assert len(late.sequences) < late.rows and max(map(len, late.sequences)) <= encoder.max_length
    bounds = late.row_bounds()
    assert bounds[-1] == late.rows and np.all(np.diff(bounds) >= 1)  # every window owns a chunk, each chunk once
    before, after = (len(t) for t in encoder.frame(options))
    firsts, lasts = late.spans.firsts.tolist(), late.spans.lasts.tolist()
    for i, sequence in enumerate(late.sequences):
        for r in range(bounds[i], bounds[i + 1]):  # a span holds its chunk's tokens, where the window has them
            alone = plain.sequences[r][before : len(plain.sequences[r]) - after]
            assert sequence[firsts[r] : lasts[r]] == alone if alone else (firsts[r], lasts[r]) == (0, len(sequence))
    # the long document is several windows; a document that fits is one, however many chunks it has
    windows_of = late.chunks.doc[bounds[:-1]].tolist()  # the document of each window
    assert windows_of.count(0) > 1 and all(windows_of.count(d) == 1 for d in range(1, len(texts)))
    assert any(n > 1 for n in late.chunks.count[late.chunks.doc >= 1].tolist())


def test_late_windows_are_packed_with_the_rows_they_own(encoder):
    texts = [" ".join(mixed_texts(30)), *mixed_texts(20)]
    cut = BatchCutter(encoder, 1024).cut(_job(texts, JobChunking(ChunkSpec(32, 4), late=True, with_text=True)))
    bounds = cut.row_bounds().tolist()
    for limits in [(512, 256, 1 << 20), (4096, 3, 1 << 20), (4096, 256, 8000)]:
        parts = list(pack_rows(cut, *limits, 1536))
        assert parts[0][0] == 0 and parts[-1][1] == len(cut.sequences)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(parts))
        tokens, seqs, size = limits
        for lo, hi in parts:
            assert hi - lo <= seqs and (hi - lo == 1 or sum(len(s) for s in cut.sequences[lo:hi]) <= tokens)
            rows = range(bounds[lo], bounds[hi])  # a result holds a vector for each chunk its windows own
            cost = sum(1536 + len(cut.doc_ids[r]) + len(cut.chunks.texts[r].encode()) for r in rows)
            assert hi - lo == 1 or cost <= size
