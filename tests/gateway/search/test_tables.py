"""The stores' edges a tenant meets, on real stores (LanceDB on disk, Qdrant's local mode): top_k up to the
documented 1000, a table named by the request (its name checked before anything is connected to, one
missing 404), a Qdrant folder another process holds answered 503 with Retry-After (a search and a job's
store alike), not 400, and the tables of one local Qdrant folder searched one at a time."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.http.limits import bind_key
from embedfleet.services.gateway.jobs.sinks import SinkJobs, SinkTargets
from embedfleet.services.gateway.search.body import MAX_TOP_K
from embedfleet.services.gateway.search.store import RETRY_AFTER, SearchTables
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.sinks import Rows, Shape, SinkError, sink_for, with_table
from embedfleet.shared.sinks.pgvector import PgVectorSink
from tests.conftest import unit_rows

DEADLINE = 60  # seconds: the first search imports the store's client
ROWS, DIM = 1100, 8


def _load(url: str, vectors: np.ndarray) -> None:
    sink = sink_for(url)
    sink.open(Shape("float32", "dense", vectors.shape[1]))
    sink.write(Rows([f"d{i}" for i in range(len(vectors))], vectors, texts=[f"t{i}" for i in range(len(vectors))]))
    sink.finish()
    sink.close()


def _search(tables: SearchTables, table: str | None, vector: np.ndarray, top_k: int = 3) -> list:
    async def run() -> list:
        try:
            return await (await tables.store(table)).search("m", vector, top_k, {}, DEADLINE)
        finally:
            await tables.close()

    return asyncio.run(run())


@pytest.mark.parametrize(("scheme", "rows"), [("lancedb", ROWS), ("qdrant", 60)])
def test_top_k_up_to_the_documented_1000(tmp_path, scheme, rows):
    """LanceDB over more rows than that; Qdrant's local mode (it writes a point at a time, some 15 ms
    each) over fewer: every row answered, none refused (pgvector's: tests/integration/test_tenants.py)."""
    url = f"{scheme}://{tmp_path}/store?{'collection' if scheme == 'qdrant' else 'table'}=many"
    vectors = unit_rows(rows, DIM)
    _load(url, vectors)
    bind_key(None)
    hits = _search(SearchTables(url), None, vectors[7], MAX_TOP_K)
    assert MAX_TOP_K == 1000 and len({h.id for h in hits}) == min(rows, 1000) and hits[0].id == "d7"


def test_a_table_the_request_names_is_another_of_the_same_store(tmp_path):
    own, other = unit_rows(20, DIM), unit_rows(20, DIM, seed=1)
    _load(f"lancedb://{tmp_path}/db?table=own", own)
    _load(f"lancedb://{tmp_path}/db?table=other", other)
    bind_key(None)
    tables = SearchTables(f"lancedb://{tmp_path}/db?table=own")
    assert _search(tables, "other", other[4])[0].id == "d4"
    with pytest.raises(ApiError) as missing:
        _search(SearchTables(f"lancedb://{tmp_path}/db?table=own"), "absent", own[0])
    assert (missing.value.status, missing.value.param) == (404, "table")
    assert not (tmp_path / "db" / "absent.lance").exists()
    with pytest.raises(ApiError) as bad:
        _search(SearchTables(f"lancedb://{tmp_path}/db?table=own"), "../own", own[0])
    assert (bad.value.status, bad.value.param) == (400, "table")


def test_the_tables_of_one_local_qdrant_folder_are_searched_one_at_a_time(tmp_path):
    first, second = unit_rows(20, DIM), unit_rows(20, DIM, seed=1)
    _load(f"qdrant://{tmp_path}/q?collection=first", first)
    _load(f"qdrant://{tmp_path}/q?collection=second", second)
    bind_key(None)
    tables = SearchTables(f"qdrant://{tmp_path}/q?collection=first")

    async def both() -> list[str]:
        try:
            found = []
            for table, vectors in ((None, first), ("second", second), (None, first)):
                hits = await (await tables.store(table)).search("m", vectors[2], 1, {}, DEADLINE)
                found.append(hits[0].id)
            return found
        finally:
            await tables.close()

    assert asyncio.run(both()) == ["d2", "d2", "d2"]


def test_a_busy_local_qdrant_folder_is_503_with_retry_after(tmp_path):
    from qdrant_client import QdrantClient

    url = f"qdrant://{tmp_path}/q?collection=docs"
    vectors = unit_rows(10, DIM)
    _load(url, vectors)
    holder = QdrantClient(path=str(tmp_path / "q"))  # another process's client, as reindex's would be
    try:
        with pytest.raises(SinkError) as busy:
            sink_for(url).attach()
        assert busy.value.retryable and "open in another process" in busy.value.message
        bind_key(None)
        with pytest.raises(ApiError) as searched:
            _search(SearchTables(url), None, vectors[0])
        assert (searched.value.code, searched.value.retry_after) == (ErrorCode.NO_RESPONDERS, RETRY_AFTER)
        answer = searched.value.response("/v1/search")
        assert answer.status_code == 503 and answer.headers["retry-after"] == str(RETRY_AFTER)
        jobs = SinkJobs(None, None, None, SinkTargets((f"qdrant://{tmp_path}/q",)), 1 << 20)
        with pytest.raises(ApiError) as submitted:
            asyncio.run(jobs.open(url, Shape("float32", "dense", DIM)))
        assert (submitted.value.status, submitted.value.param) == (503, "sink")
        assert submitted.value.response("/v1/jobs").headers["retry-after"] == str(submitted.value.retry_after)
    finally:
        holder.close()
    assert _search(SearchTables(url), None, vectors[3])[0].id == "d3"  # free again: served


def test_a_postgres_table_named_after_its_catalogs_is_refused_before_connecting():
    """No server at that address: the refusal comes from the name alone, before any connection."""
    for name in ("pg_authid", "PG_class", "pg_"):
        with pytest.raises(SinkError, match="names beginning with pg_ are PostgreSQL's own") as refused:
            PgVectorSink(f"postgresql://u@127.0.0.1:1/db?table={name}")
        assert not refused.value.retryable


def test_with_table_keeps_the_rest_of_the_url():
    pg = "postgresql://u:pw@/db?host=/tmp/a%20b&sslmode=require&table=t"
    assert with_table(pg, "x") == "postgresql://u:pw@/db?host=/tmp/a%20b&sslmode=require&table=x"
    assert sink_for(with_table(pg, "x")).table_name == "x"
    assert with_table("qdrant:///srv/q?collection=c", "d") == "qdrant:///srv/q?collection=d"
    assert with_table("lancedb:///srv/l", "e") == "lancedb:///srv/l?table=e"
