"""The store behind POST /v1/search, against real stores (LanceDB on disk, PostgreSQL by pgserver): attached
on first use and again after a failure, never made, its failures answered as 503 / 400 / 504 with the
store's own words and no password, and never used by two threads at once."""

from __future__ import annotations

import asyncio

import numpy as np
import pgserver
import psycopg
import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.search.store import SearchStore
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.sinks import Rows, Shape, sink_for
from tests.conftest import unit_rows

# a search's deadline, seconds: the first one opens the store (LanceDB's import alone takes seconds on a
# loaded machine); these tests check answers, not time
DEADLINE = 60


def _load(url: str, vectors: np.ndarray) -> None:
    sink = sink_for(url)
    sink.open(Shape("float32", "dense", vectors.shape[1]))
    sink.write(
        Rows(
            [f"d{i}" for i in range(len(vectors))],
            vectors,
            [{"n": i} for i in range(len(vectors))],
            texts=[f"text {i}" for i in range(len(vectors))],
        )
    )
    sink.close()


def _refusal(coroutine) -> ApiError:
    with pytest.raises(ApiError) as err:
        asyncio.run(coroutine)
    return err.value


def test_a_table_loaded_after_the_first_search_is_found_by_the_next(tmp_path):
    url = f"lancedb://{tmp_path}/db?table=docs"
    store = SearchStore(sink_for(url))
    vectors = unit_rows(20, 8)
    missing = _refusal(store.search("m", vectors[0], 3, {}, DEADLINE))
    assert (missing.code, missing.message) == (
        ErrorCode.NO_RESPONDERS,
        (
            f"the search store is unavailable: LanceDB at "
            f"lancedb://{tmp_path}/db?table=docs: no table docs: load one first"
        ),
    )
    assert not (tmp_path / "db" / "docs.lance").exists()
    _load(url, vectors)
    hits = asyncio.run(store.search("m", vectors[4], 3, {}, DEADLINE))
    assert next((h.id, h.text) for h in hits) == ("d4", "text 4") and hits[0].score == pytest.approx(1.0, abs=1e-6)
    wrong = _refusal(store.search("big-model", np.ones(16, np.float32), 3, {}, DEADLINE))
    assert (wrong.code, wrong.param) == (ErrorCode.INVALID_REQUEST, "model")
    assert wrong.message.startswith("big-model makes vectors of 16 dimensions; the search store lancedb://")
    filtered = _refusal(
        store.search("m", vectors[0], 3, {"n": 1}, DEADLINE)
    )  # LanceDB tables are searched without filters
    assert (filtered.code, filtered.param) == (
        ErrorCode.INVALID_REQUEST,
        "filter",
    ) and "without filters" in filtered.message
    asyncio.run(store.close())


def test_a_store_of_vectors_search_does_not_serve_is_named(tmp_path):
    url = f"lancedb://{tmp_path}/db?table=bits"
    sink_for(url).open(Shape("ubinary", "dense", 16))
    refused = _refusal(SearchStore(sink_for(url)).search("m", np.ones(16, np.float32), 3, {}, DEADLINE))
    assert refused.code is ErrorCode.NO_RESPONDERS
    assert refused.message.endswith(
        "holds dense ubinary vectors; search is served over dense float32 or float16 vectors"
    )


@pytest.fixture
def postgres(tmp_path):
    folder = tmp_path / "pg"
    server = pgserver.get_server(folder, cleanup_mode="stop")
    yield folder, server.get_uri()
    pgserver.get_server(folder, cleanup_mode="stop").cleanup()


def test_a_store_down_is_503_without_its_password_and_found_again_when_back(postgres):
    folder, uri = postgres
    url = uri.replace("postgres:@", "postgres:s3cret-pw@") + "&table=docs"  # the socket trusts: the password is unused
    vectors = unit_rows(30, 8)
    _load(url, vectors)
    store = SearchStore(sink_for(url))
    assert [h.id for h in asyncio.run(store.search("m", vectors[3], 1, {"n": 3}, DEADLINE))] == ["d3"]
    pgserver.get_server(folder).cleanup()  # the server stops
    down = _refusal(store.search("m", vectors[3], 1, {}, DEADLINE))
    assert down.code is ErrorCode.NO_RESPONDERS and down.message.startswith(
        "the search store is unavailable, try again"
    )
    assert "postgres:***@" in down.message and "s3cret-pw" not in down.message
    pgserver.get_server(folder, cleanup_mode="stop")  # back, on the same socket
    assert [h.id for h in asyncio.run(store.search("m", vectors[5], 1, {}, DEADLINE))] == ["d5"]
    asyncio.run(store.close())


def test_a_search_past_its_deadline_is_504_and_the_next_waits_for_it(postgres):
    _, uri = postgres
    vectors = unit_rows(10, 8)
    _load(f"{uri}&table=locked", vectors)
    store = SearchStore(sink_for(f"{uri}&table=locked"))
    asyncio.run(store.search("m", vectors[0], 1, {}, DEADLINE))  # attached
    with psycopg.connect(uri) as holder:
        holder.execute("LOCK TABLE locked IN ACCESS EXCLUSIVE MODE")  # a search waits for this transaction

        async def two_late_then_one_in_time() -> tuple:
            late = await asyncio.gather(
                *(store.search("m", vectors[0], 1, {}, 0.5) for _ in range(2)), return_exceptions=True
            )
            await asyncio.to_thread(holder.rollback)  # the lock goes: the first search ends in its thread
            return late, await store.search("m", vectors[2], 1, {}, 10)

        late, hits = asyncio.run(two_late_then_one_in_time())
    assert [(e.code, e.message) for e in late] == [
        (ErrorCode.TIMEOUT, f"the search store {store.shown} did not answer within 0.5s")
    ] * 2
    assert [h.id for h in hits] == ["d2"]
    asyncio.run(store.close())


def test_shutdown_does_not_wait_for_a_store_that_hangs(postgres):
    _, uri = postgres
    vectors = unit_rows(4, 8)
    _load(f"{uri}&table=stuck", vectors)
    store = SearchStore(sink_for(f"{uri}&table=stuck"))
    with psycopg.connect(uri) as holder:
        holder.execute("LOCK TABLE stuck IN ACCESS EXCLUSIVE MODE")

        async def search_then_close() -> float:
            late = await asyncio.gather(store.search("m", vectors[0], 1, {}, 0.3), return_exceptions=True)
            assert isinstance(late[0], ApiError) and late[0].code is ErrorCode.TIMEOUT
            started = asyncio.get_running_loop().time()
            await store.close(timeout=0.5)  # the call still runs in its thread: closed without it
            waited = asyncio.get_running_loop().time() - started
            await asyncio.to_thread(holder.rollback)
            return waited

        assert 0.4 < asyncio.run(search_then_close()) < 2
