"""A chunked job's batches fitted to the tokenizers' --max-chunks before anything is published
(shared/jobs/fit.py): counted from characters / (size - overlap), a token a character, so that no
batch's documents together pass the limit the tokenizer holds a batch to; a document that alone makes
more is a batch alone; a tokenizer that says no limit leaves the size as asked."""

from __future__ import annotations

import pytest

from embedfleet.shared.jobs.fit import JobTooLarge, check_job
from embedfleet.shared.nats.fleet import FleetView
from embedfleet.shared.protocol import EmbedOptions
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking

MB8 = 8 * 1024 * 1024
TOKENIZER = {"max_seq_length": "256", "dim": "384", "vocab_size": "30522", "max_chunks": "100"}
WORKER = {"dim": "384", "task": "embed", "outputs": "dense"}


def _fit(chars: list[int], spec: ChunkSpec, batch_size: int = 64, tokenizer: dict = TOKENIZER):
    view = FleetView({"m": tokenizer}, {"m": WORKER}, 0.0)
    ids = [f"d{i}" for i in range(len(chars))]
    return check_job(view, "m", EmbedOptions(), batch_size, MB8, ids, JobChunking(spec), chars)


def test_most_chunks_is_the_cut_at_a_token_a_character():
    spec = ChunkSpec(10, 4)  # the first window 10 characters, each after 6 more
    assert [spec.most_chunks(n) for n in (0, 1, 10, 11, 16, 17, 22)] == [1, 1, 1, 2, 2, 3, 3]
    assert ChunkSpec(1).most_chunks(7_500_000) == 7_500_000


def test_batches_are_cut_until_each_holds_at_most_max_chunks():
    fit = _fit([100] * 40, ChunkSpec(10))  # 10 chunks a document: 10 documents a batch
    assert fit.batch_size == 10
    assert fit.note == (
        "batch size cut from 64 to 10: a chunked batch is cut into at most 100 chunks (the tokenizers' "
        "--max-chunks), counted as its documents' characters / (chunking.size - overlap)"
    )
    assert _fit([100] * 40, ChunkSpec(10), batch_size=8).batch_size == 8  # within it: as asked, no note
    assert _fit([100] * 40, ChunkSpec(10), batch_size=8).note is None
    # overlap counts: windows of 10 characters, 1 new each, make 91 chunks of 100 characters
    assert _fit([100] * 4, ChunkSpec(10, 9)).batch_size == 1


def test_a_document_past_the_limit_alone_makes_batches_of_one_and_no_limit_none():
    assert _fit([50, 5000, 50], ChunkSpec(10)).batch_size == 1  # the tokenizer counts its real chunks
    assert _fit([5000] * 3, ChunkSpec(10), tokenizer={**TOKENIZER, "max_chunks": "0"}).batch_size == 64
    without = {k: v for k, v in TOKENIZER.items() if k != "max_chunks"}
    assert _fit([5000] * 3, ChunkSpec(10), tokenizer=without).batch_size == 64
    # a plain job is not fitted to chunks
    view = FleetView({"m": TOKENIZER}, {"m": WORKER}, 0.0)
    assert check_job(view, "m", EmbedOptions(), 64, MB8, ["a", "b"], None, [5000, 5000]).batch_size == 64


def test_a_plain_job_whose_vectors_pass_the_result_budget_is_too_large():
    view = FleetView({"m": TOKENIZER}, {"m": WORKER}, 0.0)
    ids = [f"doc-{i}" for i in range(10)]  # 5 bytes each: 10 x (1536 + 5 + 5) = 15,460 bytes
    assert check_job(view, "m", EmbedOptions(), 64, MB8, ids, max_result_bytes=15_460).batch_size == 64
    with pytest.raises(JobTooLarge) as caught:
        check_job(view, "m", EmbedOptions(), 64, MB8, ids, max_result_bytes=15_459)
    assert caught.value.field == "documents" and str(caught.value) == (
        "the job's 10 documents' vectors may take 15,460 bytes in the results stream, over the 15,459 one job may "
        "store (--job-max-result-bytes): submit them as several jobs"
    )
    # a chunked job's rows are counted as they are cut, by the tokenizers
    chunked = check_job(view, "m", EmbedOptions(), 64, MB8, ids, JobChunking(ChunkSpec(8)), [5] * 10, 15_459)
    assert chunked.batch_size == 64
