"""Job ids as subject tokens, the rule for ids given by people, and what a job id claims (no I/O)."""

from __future__ import annotations

import itertools
import re

from embedfleet.shared.jobs.ids import job_id_problem
from embedfleet.shared.jobs.requests import Claim, claim_problem, record_claim, request_digest
from embedfleet.shared.jobs.state import JobState
from embedfleet.shared.nats.subjects import Subjects, job_token
from embedfleet.shared.protocol import EmbedOptions
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking


def test_job_tokens_are_one_to_one_and_valid_subject_tokens():
    ids = [
        "victim.job",
        "victim/job",
        "victim=job",
        "victim_job",
        "victim_2Ejob",
        "docs.2026-12-01",
        "docs_2026-12-01",
        *("".join(p) for p in itertools.product("a._/=-", repeat=3)),
    ]
    tokens = [job_token(j) for j in ids]
    assert len(set(tokens)) == len(ids)
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", t) for t in tokens)  # no '.', '*', '>' or space: one token
    assert job_token("docs.2026-12-01") == "docs_2E2026-12-01" and job_token("docs_2026-12-01") == "docs_5F2026-12-01"
    assert job_token("0123abcd-x") == "0123abcd-x"  # ids reindex makes keep the subject they had
    assert Subjects("p").results("a.b") == "p.v1.results.a_2Eb" and Subjects("p").dead("a_b") == "p.v1.dead.a_5Fb"


def test_the_rule_for_job_ids():
    for bad in ("", ".a", "a.", "a..b", "a b", "x" * 129, "a*b", "progress.a"):
        assert job_id_problem(bad) == (
            f"invalid job id {bad[:100]!r}: at most 128 letters, digits and - _ = / ., "
            "with no empty part between dots (not '', '.a', 'a.', 'a..b'), not starting 'progress.' "
            "(a job's progress key)"
        )
    for good in ("a.b", "a/b=c_d-e", "x" * 128, "progress", "a.progress.b"):
        assert job_id_problem(good) is None


def test_a_request_digest_changes_with_anything_that_makes_the_batches():
    docs = [("a", "first"), ("b", "second")]
    base = request_digest("m", docs, 16, EmbedOptions())
    assert base == request_digest("m", list(docs), 16, EmbedOptions())
    others = [
        request_digest("m2", docs, 16, EmbedOptions()),
        request_digest("m", docs, 8, EmbedOptions()),
        request_digest("m", docs, 16, EmbedOptions(dtype="i1")),
        request_digest("m", docs[:1], 16, EmbedOptions()),
        request_digest("m", [("a", "firs"), ("tb", "second")], 16, EmbedOptions()),
        request_digest("m", [("a", "first"), ("b", "second!")], 16, EmbedOptions()),
        request_digest("m", docs, 16, EmbedOptions(), JobChunking(ChunkSpec(8))),
    ]
    assert len({base, *others}) == 8


def test_a_claim_on_a_recorded_job():
    state = record_claim(JobState("j", documents=2), Claim("d1", "owner-a"))
    assert (state.request, state.owner) == ("d1", "owner-a")
    mine = Claim("d1", "owner-a")
    assert claim_problem(state, mine) is None and claim_problem(None, mine) is None
    assert claim_problem(JobState("j"), mine) is None  # counts, but no job recorded
    assert claim_problem(state, Claim("d1")) is None  # no owner asked: reindex resumes it
    assert claim_problem(state, Claim("d1", "owner-b")) == "job id j is taken: give another job id"
    assert claim_problem(state, Claim("d2")).startswith(
        "job j exists with other documents, model, batch size or options"
    )
    assert record_claim(state, Claim("d2", "owner-b")) == state  # the first submission's digests stay
