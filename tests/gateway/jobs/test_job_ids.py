"""Job ids from HTTP: refused at once when they cannot name a subject token or a bucket key."""

from __future__ import annotations

import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.jobs.api import check_job_id
from embedfleet.shared.errors import ErrorCode


@pytest.mark.parametrize("job", ["a..b", ".a", "a.", "", "a b", "a*", "a>", "x" * 129])
def test_ids_that_name_no_key_are_refused(job):
    with pytest.raises(ApiError) as caught:
        check_job_id(job)
    assert (caught.value.code, caught.value.param) == (ErrorCode.INVALID_REQUEST, "id")
    assert caught.value.message.startswith(f"invalid job id {job[:100]!r}: at most 128 letters")


@pytest.mark.parametrize("job", ["a", "a.b", "run-1_2=3", "x" * 128])
def test_good_ids_pass(job):
    assert check_job_id(job) == job


@pytest.mark.parametrize("job", ["q/results", "a/b", "/", "a/", "/a"])
def test_ids_with_a_slash_are_refused_the_job_routes_could_not_take_them(job):
    """``/v1/jobs/q/results`` is job ``q``'s results: a job ``q/results`` could never be read, and its
    reader would be given ``q``'s."""
    with pytest.raises(ApiError) as caught:
        check_job_id(job)
    assert (caught.value.code, caught.value.param) == (ErrorCode.INVALID_REQUEST, "id")
    assert caught.value.message == (
        f"invalid job id {job!r}: no '/' in a job id (a job is read at /v1/jobs/ID and "
        "/v1/jobs/ID/results, where a '/' would end the id)"
    )
