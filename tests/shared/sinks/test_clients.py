"""A sink whose store's client library is not installed here (no extra 'sinks'): refused when its URL is
given, naming the extra to install, and a store call that fails so answers a SinkError, not an
ImportError raised again on the error path."""

from __future__ import annotations

import sys

import pytest

from embedfleet.shared.extras import MissingExtra
from embedfleet.shared.sinks import SinkError, checked_sink, sink_for
from embedfleet.shared.sinks.pgvector import PgVectorSink
from embedfleet.shared.sinks.qdrant import QdrantSink

PG = "postgresql://loader:secret@db.internal:5432/docs?table=t"
PG_SHOWN = "postgresql://loader:***@db.internal:5432/docs?table=t"
INSTALL = "which the extra 'sinks' installs: pip install 'embedfleet[sinks]'"


def _stores(tmp_path) -> list[tuple[str, str, str]]:
    """(URL, a module its client needs, the URL as shown)."""
    lance = f"lancedb://{tmp_path}/db?table=t"
    return [
        (PG, "psycopg", PG_SHOWN),
        (PG, "pgvector", PG_SHOWN),
        ("qdrant://localhost:6333?collection=c", "qdrant_client", "qdrant://localhost:6333?collection=c"),
        (lance, "lancedb", lance),
    ]


@pytest.mark.parametrize("store", range(4), ids=["psycopg", "pgvector", "qdrant_client", "lancedb"])
def test_a_sink_without_its_client_is_refused_naming_the_extra(monkeypatch, tmp_path, store):
    url, module, shown = _stores(tmp_path)[store]
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: its import fails
    with pytest.raises(SinkError) as raised:
        sink_for(url)
    assert raised.value.message == f"the sink {shown} needs {module}, {INSTALL}"
    assert not raised.value.retryable
    with pytest.raises(MissingExtra) as refused:
        checked_sink(url, "--search-sink")
    assert str(refused.value) == f"--search-sink {shown} needs {module}, {INSTALL}"
    assert refused.value.extra == "sinks"


def test_a_sink_with_its_client_is_checked_for_its_url_only(tmp_path):
    for url, _, _ in _stores(tmp_path):
        checked_sink(url, "--job-sinks")  # nothing connected to
    with pytest.raises(Exception, match=r"^--job-sinks: unknown sink 'mysql://'"):
        checked_sink("mysql://localhost/db", "--job-sinks")


def test_a_store_call_without_its_client_answers_a_sink_error(monkeypatch):
    """The error path reads the client's exception types only where the client was imported: a call
    whose import failed is a SinkError naming the extra, not that import failing again."""
    pg, qdrant = PgVectorSink(PG), QdrantSink("qdrant://localhost:6333?collection=c")
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.setitem(sys.modules, "qdrant_client", None)
    for sink, module, call in (
        (pg, "psycopg", pg.attach),
        (qdrant, "qdrant_client", qdrant.attach),
        (qdrant, "qdrant_client", qdrant.count),
    ):
        with pytest.raises(SinkError) as raised:
            call()
        assert raised.value.message == f"the sink {sink.shown} needs {module}, {INSTALL}"
        assert not raised.value.retryable
