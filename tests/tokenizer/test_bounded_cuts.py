"""services/tokenizer/bounded_cuts.py: texts are encoded a group of at most GROUP_CHARS characters at a
time, a longer text alone, the cuts the same as one encoding of each; a job's document over the
character limit is given up unread, the others cut as before (no NATS here; a tokenizer process's
memory under such requests: tests/integration/test_bounded_work.py)."""

from __future__ import annotations

from embedfleet.services.tokenizer.bounded_cuts import cuts, groups
from embedfleet.services.tokenizer.bulk_chunks import BatchCutter, over_budget
from embedfleet.services.tokenizer.chunking import cut, whole_text_tokenizer
from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.shared.protocol import EmbedOptions, JobBatch
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking
from tests.support.corpus import mixed_texts


def test_groups_hold_at_most_the_budget_a_longer_text_alone():
    assert [list(r) for r in groups([3, 3, 3, 10, 1, 1], 6)] == [[0, 1], [2], [3], [4, 5]]
    assert [list(r) for r in groups([], 6)] == []
    assert [list(r) for r in groups([7], 6)] == [[0]]


def test_cuts_in_groups_are_each_texts_own_cut(model_info):
    encoder = TextEncoder(model_info)
    whole = whole_text_tokenizer(encoder._by_mode["right"])
    texts = [*mixed_texts(60), "", "x" * 70_000]  # more than one group, and a text longer than a group
    spec = ChunkSpec(48, 8)
    got = [list(c) for c in cuts(encoder.whole_text_tokenizer(), texts, spec)]
    assert got == [list(cut(t, whole.encode(t, add_special_tokens=False), spec, whole)) for t in texts]


def test_a_document_over_the_character_limit_is_given_up_unread(model_info):
    encoder = TextEncoder(model_info)
    texts = ["short one", "y " * 60, "also short"]  # 120 characters: over 100
    job = JobBatch("j", 0, "m", ["a", "b", "c"], texts, EmbedOptions(), JobChunking(ChunkSpec(4)))
    batch = BatchCutter(encoder, 1024, 100).cut(job)
    assert batch.failed == [
        (
            1,
            (
                "document 'b' has 120 characters, over the 100 a text cut into chunks may have (the tokenizer's "
                "--max-document-chars): cut it into shorter texts"
            ),
        )
    ]
    assert batch.doc_ids == ["a", "c"]  # a chunk each: two tokens


def test_a_batch_holds_at_most_max_chunks_in_all_the_documents_past_it_given_up(model_info):
    encoder = TextEncoder(model_info)
    words = " ".join(["word"] * 40)  # 40 tokens: 10 chunks of 4
    texts = [words, words, "short one", words]  # 10, 10 (20 of 25), 1 (21), 10: past 25
    job = JobBatch("j", 0, "m", ["a", "b", "c", "d"], texts, EmbedOptions(), JobChunking(ChunkSpec(4)))
    batch = BatchCutter(encoder, 25).cut(job)
    assert batch.failed == [
        (
            3,
            (
                "document 'd' is cut into 10 chunks, which take its job batch past the 25 a batch may be cut into "
                "(the tokenizer's --max-chunks; 21 before it): give a smaller batch size or a larger chunk size"
            ),
        )
    ]
    assert batch.doc_ids == ["a"] * 10 + ["b"] * 10 + ["c"] and len(batch.sequences) == 21


def test_a_batch_past_the_jobs_result_budget_is_named_with_it(model_info):
    encoder = TextEncoder(model_info)
    words = " ".join(["word"] * 40)
    job = JobBatch("j", 0, "m", ["a", "b"], [words, words], EmbedOptions(), JobChunking(ChunkSpec(4)))
    batch = BatchCutter(encoder, 1024).cut(job)  # 20 chunks, ids of one byte
    size = batch.result_bytes(1536)
    assert size == 20 * (1536 + 56 + 1)
    assert over_budget(batch, 1536, 0, size) is None and over_budget(batch, 1536, 10**9, 0) is None  # 0: no limit
    assert over_budget(batch, 1536, 20, 2 * size) is None  # 20 before, counted at this batch's bytes a chunk
    assert over_budget(batch, 1536, 21, 2 * size) == (
        f"its 20 chunks would take the job's results to some {size + 21 * 1593:,} bytes (41 chunks), over the "
        f"{2 * size:,} one job may store (the tokenizer's --job-max-result-bytes): give a larger chunk size, or "
        "fewer documents a job"
    )
