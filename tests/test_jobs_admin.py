"""``embedfleet jobs``'s figures from a job's recorded state: progress, rate, ETA."""

import pytest

from services.jobs_admin import HEADER, duration, job_row, progress


def test_a_running_job_has_a_rate_and_an_eta():
    state = {"status": "running", "documents": 1000, "done": 240, "failed": 10, "tokens": 5000, "started": 100.0}
    p = progress(state, now=150.0)
    assert (p.settled, p.total, p.seconds) == (250, 1000, 50.0)
    assert p.fraction == pytest.approx(0.25)
    assert p.docs_per_s == pytest.approx(5.0)  # 250 documents in 50 s
    assert p.tokens_per_s == pytest.approx(100.0)
    assert p.eta == pytest.approx(150.0)  # 750 documents left at 5/s


def test_a_finished_job_is_rated_until_it_finished_and_has_no_eta():
    state = {"status": "done", "documents": 300, "done": 300, "tokens": 9000, "started": 10.0, "finished": 40.0}
    p = progress(state, now=10_000.0)
    assert p.seconds == 30.0 and p.docs_per_s == pytest.approx(10.0) and p.tokens_per_s == pytest.approx(300.0)
    assert p.fraction == 1.0 and p.eta is None


@pytest.mark.parametrize("state", [
    {"status": "running", "documents": 10, "started": 5.0},  # nothing settled yet: no rate
    {"status": "running", "documents": 10, "done": 4},  # no start recorded
    {"status": "running"},  # a state without its documents yet
    {"status": "stalled", "documents": 10, "done": 4, "started": 5.0},  # not running: no ETA
])
def test_no_eta_without_a_rate_or_a_running_job(state):
    assert progress(state, now=20.0).eta is None


def test_duration():
    assert [duration(s) for s in (None, 0, 59.4, 61, 3599, 3600, 7325)] == ["-", "0s", "59s", "1m01s", "59m59s",
                                                                          "1h00m", "2h02m"]


def test_a_row_lines_up_with_the_header():
    state = {"status": "running", "documents": 1000, "done": 240, "failed": 10, "tokens": 5000, "started": 100.0,
             "batches": 16, "published": 16, "model": "all-MiniLM-L6-v2", "embedding_type": "int8"}
    row = job_row("0123456789abcdef", state, now=150.0)
    assert row.split() == ["0123456789abcdef", "running", "1000", "240", "10", "25.0%", "5.0", "100", "2m30s", "16",
                           "16", "all-MiniLM-L6-v2", "int8"]
    assert HEADER.split() == ["job", "status", "documents", "done", "failed", "progress", "docs/s", "tokens/s", "eta",
                              "batches", "published", "model", "form"]
    assert HEADER.index("eta") + len("eta") == row.index("2m30s") + len("2m30s")  # right-aligned under its title
