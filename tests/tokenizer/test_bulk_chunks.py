"""services/tokenizer/bulk_chunks.py: a chunked job batch's rows are its documents' chunks, each
sequence the model's tokenization of the chunk's text (with the prompt before it), made from the
document's tokens without tokenizing the chunk again; a document cut into too many chunks is given up
alone; rows are packed within tokens, rows and bytes (no NATS here; on the stack:
tests/integration/test_job_chunks.py)."""

from __future__ import annotations

import pytest

from shared.errors import ErrorCode, ServiceError
from shared.protocol import EmbedOptions, JobBatch
from shared.text_chunks import ChunkSpec, JobChunking
from services.tokenizer.bulk_chunks import BatchCutter, pack_rows
from services.tokenizer.encoder import TextEncoder
from tests.corpus import mixed_texts

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
        mine = [(k, n) for doc, k, n in zip(chunks.doc.tolist(), chunks.chunk.tolist(), chunks.count.tolist()) if doc == d]
        assert mine == [(k, len(mine)) for k in range(len(mine))]
    assert max(len(s) for s in cut.sequences) <= encoder.max_length


def test_a_document_over_max_chunks_is_given_up_alone(encoder):
    cut = BatchCutter(encoder, 5).cut(_job(["short", " ".join(["word"] * 6), "also short"], JobChunking(ChunkSpec(1))))
    assert cut.failed == [(1, "document 'd1' is cut into 6 chunks, over the 5 a document may be (the tokenizer's "
                              "--max-chunks): give a larger chunk size, or cut the document")]
    assert cut.doc_ids == ["d0", "d2", "d2"] and cut.chunks.documents == 3 and cut.chunks.texts is None


@pytest.mark.parametrize("chunking, said", [
    (JobChunking(ChunkSpec(8), late=True), "late chunking in jobs is not served yet"),
    (JobChunking(ChunkSpec(255)), "chunking.size is 255; this model holds at most 254 tokens of text a chunk"),
])
def test_what_no_document_can_be_cut_for_gives_the_batch_up(encoder, chunking, said):
    with pytest.raises(ServiceError) as caught:
        BatchCutter(encoder, 1024).cut(_job(["text"], chunking))
    assert caught.value.code == ErrorCode.INVALID_REQUEST and said in caught.value.message


def test_rows_are_packed_within_tokens_rows_and_bytes(encoder):
    cut = BatchCutter(encoder, 1024).cut(_job(mixed_texts(40), JobChunking(ChunkSpec(32), with_text=True)))
    for limits in [(256, 256, 1 << 20), (4096, 5, 1 << 20), (4096, 256, 8000)]:
        parts = list(pack_rows(cut, *limits, 1536))
        assert parts[0][0] == 0 and parts[-1][1] == len(cut.sequences)
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # in order, every row once
        tokens, seqs, size = limits
        for lo, hi in parts:
            assert hi - lo <= seqs and (hi - lo == 1 or sum(len(s) for s in cut.sequences[lo:hi]) <= tokens)
            cost = sum(1536 + len(cut.doc_ids[i]) + len(cut.chunks.texts[i].encode()) for i in range(lo, hi))
            assert hi - lo == 1 or cost <= size
    assert len(list(pack_rows(cut, 4096, 256, 8000, 1536))) > len(list(pack_rows(cut, 4096, 256, 1 << 20, 1536)))
