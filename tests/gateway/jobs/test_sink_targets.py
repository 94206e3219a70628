"""Which stores POST /v1/jobs may write into: a request's URL resolved against the gateway's
--job-sinks (the table free, the credentials the gateway's), and everything else refused."""

import asyncio
import sys

import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.jobs.sinks import SinkJobs, SinkTargets, sink_shown
from embedfleet.shared.sinks import Shape

PG = "postgresql://loader:pw@db.internal:5432/docs?sslmode=require"
LANCE = "lancedb:///srv/lance"


def _refused(targets: SinkTargets, url: str) -> str:
    with pytest.raises(ApiError) as raised:
        targets.resolve(url)
    assert raised.value.status == 400 and raised.value.param == "sink"
    return raised.value.message


def test_a_request_names_an_allowed_store_and_chooses_its_table():
    targets = SinkTargets((PG, LANCE))
    assert (
        targets.resolve("postgresql://db.internal:5432/docs?sslmode=require&table=news")
        == "postgresql://loader:pw@db.internal:5432/docs?sslmode=require&table=news"
    )
    assert targets.resolve("postgres://loader@DB.internal:5432/docs?table=t&index=none&sslmode=require").endswith(
        "?sslmode=require&table=t&index=none"
    )
    assert targets.resolve("lancedb:///srv/lance?table=x") == "lancedb:///srv/lance?table=x"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://db.internal:5433/docs?sslmode=require&table=t",  # another port
        "postgresql://other:5432/docs?sslmode=require&table=t",  # another host
        "postgresql://db.internal:5432/other?sslmode=require&table=t",  # another database
        "postgresql://db.internal:5432/docs?table=t",  # another parameter (no TLS)
        "postgresql://admin@db.internal:5432/docs?sslmode=require&table=t",  # another user
        "lancedb:///srv/other?table=x",
        "qdrant://localhost:6333?collection=c",
        "not a url",
    ],
)
def test_other_stores_are_refused_naming_none_of_the_allowed_ones(url):
    """The refusal says which scheme is not allowed, never the gateway's stores: no host, folder or user."""
    message = _refused(SinkTargets((PG, LANCE)), url)
    assert "does not write into" in message
    assert not any(told in message for told in ("db.internal", "loader", "/srv", "5432", "docs", "pw")), message


def test_a_url_with_a_password_and_a_gateway_without_sinks_are_refused():
    assert "no password" in _refused(SinkTargets((PG,)), "postgresql://loader:pw@db.internal:5432/docs?table=t")
    assert "--job-sinks is not set" in _refused(SinkTargets(()), "lancedb:///srv/lance?table=x")
    assert "not a URL" in _refused(SinkTargets((PG,)), "postgresql://db.internal:99999/docs")


def test_an_empty_password_is_none():
    uri = "postgresql://postgres:@/postgres?host=/tmp/sock"
    assert SinkTargets((uri,)).resolve(f"{uri}&table=t") == f"{uri}&table=t"
    assert sink_shown(uri) == uri and sink_shown(PG) == "postgresql://loader:***@db.internal:5432/docs?sslmode=require"


def test_a_job_whose_store_has_no_client_here_is_refused_naming_the_extra(monkeypatch):
    """The gateway checked its stores' clients at start-up; one gone since (an install changed under a
    running gateway) refuses the job in the API's shape, 400 on 'sink', before anything is published."""
    jobs = SinkJobs(None, None, None, SinkTargets((PG,)), 1 << 20)
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(ApiError) as raised:
        asyncio.run(
            jobs.open("postgresql://db.internal:5432/docs?sslmode=require&table=news", Shape("float32", "dense", 4))
        )
    assert (raised.value.status, raised.value.param) == (400, "sink")
    assert raised.value.message == (
        "the sink postgresql://loader:***@db.internal:5432/docs?sslmode=require&table=news needs psycopg, which the "
        "extra 'sinks' installs: pip install 'embedfleet[sinks]'"
    )
