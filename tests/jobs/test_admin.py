"""``embedfleet jobs``'s figures from a job's recorded state: progress, rate, ETA."""

from dataclasses import replace

import pytest

from embedfleet.services.jobs.admin import HEADER, duration, job_row, progress
from embedfleet.shared.jobs.state import JobState, Run
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking


def job(started: float | None = None, **fields) -> JobState:
    """A submitted job's state; ``started``: when its run started (None: no run recorded)."""
    run = None if started is None else Run(started, 0, 0, 0)
    return JobState(
        "j",
        **{
            "model": "m",
            "input": "inline",
            "embedding_type": "float32",
            "output": "dense",
            "started": started,
            "run": run,
            **fields,
        },
    )


def test_a_running_job_has_a_rate_and_an_eta():
    state = job(100.0, status="running", documents=1000, done=240, failed=10, tokens=5000)
    p = progress(state, now=150.0)
    assert (p.settled, p.total, p.seconds) == (250, 1000, 50.0)
    assert p.fraction == pytest.approx(0.25)
    assert p.docs_per_s == pytest.approx(4.8)  # 240 documents embedded in 50 s (the 10 given up are not)
    assert p.tokens_per_s == pytest.approx(100.0)
    assert p.eta == pytest.approx(150.0)  # 750 documents left, settled at 5/s


def test_a_finished_job_is_rated_until_it_finished_and_has_no_eta():
    state = job(10.0, status="done", documents=300, done=300, tokens=9000, finished=40.0)
    p = progress(state, now=10_000.0)
    assert p.seconds == 30.0 and p.docs_per_s == pytest.approx(10.0) and p.tokens_per_s == pytest.approx(300.0)
    assert p.fraction == 1.0 and p.eta is None


@pytest.mark.parametrize(
    "state",
    [
        job(5.0, status="running", documents=10),  # nothing settled yet: no rate
        job(status="running", documents=10, done=4),  # no run recorded
        JobState("j", status="running"),  # a state without its documents yet
        job(5.0, status="stalled", documents=10, done=4),  # not running: no ETA
    ],
)
def test_no_eta_without_a_rate_or_a_running_job(state):
    assert progress(state, now=20.0).eta is None


def test_duration():
    assert [duration(s) for s in (None, 0, 59.4, 61, 3599, 3600, 7325)] == [
        "-",
        "0s",
        "59s",
        "1m01s",
        "59m59s",
        "1h00m",
        "2h02m",
    ]


def test_a_row_lines_up_with_the_header():
    state = job(
        100.0,
        status="running",
        documents=1000,
        done=240,
        failed=10,
        tokens=5000,
        batches=16,
        published=16,
        model="all-MiniLM-L6-v2",
        embedding_type="int8",
    )
    row = job_row("0123456789abcdef", state, now=150.0)
    assert row.split() == [
        "0123456789abcdef",
        "running",
        "1000",
        "240",
        "10",
        "25.0%",
        "4.8",
        "100",
        "2m30s",
        "16",
        "16",
        "-",
        "all-MiniLM-L6-v2",
        "int8",
    ]
    assert HEADER.split() == [
        "job",
        "status",
        "documents",
        "done",
        "failed",
        "progress",
        "docs/s",
        "tokens/s",
        "eta",
        "batches",
        "published",
        "chunks",
        "model",
        "form",
    ]
    assert HEADER.index("eta") + len("eta") == row.index("2m30s") + len("2m30s")  # right-aligned under its title


def test_a_chunked_job_shows_its_chunks_stored_of_those_cut():
    state = job(status="running", documents=10, done=4, chunks=37, chunks_done=21, chunking=JobChunking(ChunkSpec(64)))
    row = job_row("j", state, now=1.0)
    assert row.split()[11] == "21/37"
    assert HEADER.index("chunks") + len("chunks") == row.index("21/37") + len("21/37")


def test_a_job_whose_every_batch_failed_has_no_rate():
    state = job(10.0, status="done_with_errors", documents=4902, failed=4902, finished=11.0)
    p = progress(state, now=100.0)
    assert p.docs_per_s is None and p.tokens_per_s is None
    row = job_row("allfailed", state, now=100.0).split()
    assert row[:8] == ["allfailed", "done_with_errors", "4902", "0", "4902", "100.0%", "-", "-"]


def test_a_resumed_job_is_rated_by_its_current_run_only():
    """Started at 0, stopped having stored 900 documents (9M tokens); resumed at 1000 with 100 left:
    the rate is those 100 over the 20 s since the resume, not 1,000 over 1,020 s or 9M tokens over 20 s."""
    state = job(
        0.0,
        status="done",
        documents=1000,
        done=1000,
        tokens=10_000_000,
        finished=1020.0,
        run=Run(1000.0, 900, 0, 9_000_000),
    )
    p = progress(state, now=5000.0)
    assert p.seconds == 20.0 and p.docs_per_s == pytest.approx(5.0) and p.tokens_per_s == pytest.approx(50_000.0)
    running = replace(state, status="running", done=950, tokens=9_500_000, finished=None)
    p = progress(running, now=1010.0)
    assert p.docs_per_s == pytest.approx(5.0) and p.eta == pytest.approx(10.0)


@pytest.mark.parametrize(
    "output, form, shown",
    [
        ("sparse", "float32", "sparse float32"),
        ("dense", "int8", "int8"),
        ("multivector", "float16", "multivector float16"),
        (None, None, "?"),
    ],
)
def test_the_form_column_shows_the_jobs_output_and_form(output, form, shown):
    state = JobState("j", status="running", documents=10, model="m", output=output, embedding_type=form)
    assert job_row("j", state, now=1.0).endswith(f"  m  {shown}")
