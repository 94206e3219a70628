"""Search over a table of multi-vectors (a page model's job): LanceDB's and Qdrant's own late-interaction
searches against MaxSim computed here over the vectors the table holds (services/gateway/rerank/late.py's),
the query's output chosen from the table's rows and the model's outputs, and the store that cannot serve
such a table (pgvector) named. Real stores on disk (LanceDB, Qdrant's local mode)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.rerank.late import maxsim, ranked
from embedfleet.services.gateway.search.store import SearchStore, query_output
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.sinks import Rows, Shape, sink_for
from tests.gateway.search.test_store import DEADLINE, _refusal

DIM = 16
MULTI = Shape("float32", "multivector", DIM)


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _pages(n: int, seed: int) -> list[np.ndarray]:
    """``n`` pages of unit token vectors [tokens, DIM], 1 to 40 tokens each."""
    rng = np.random.default_rng(seed)
    return [_unit(rng.standard_normal((int(rng.integers(1, 41)), DIM))) for _ in range(n)]


def _load(url: str, pages: list[np.ndarray]) -> None:
    sink = sink_for(url)
    sink.open(MULTI)
    ids = [f"p{i}" for i in range(len(pages))]
    sink.write(Rows(ids, pages, [{"n": i} for i in range(len(pages))]))
    sink.finish()
    sink.close()


def _stored(path: str, table: str) -> dict[str, np.ndarray]:
    """The table's rows as LanceDB holds them: id -> [tokens, DIM]."""
    import lancedb

    rows = lancedb.connect(path).open_table(table).to_arrow().to_pylist()
    return {r["id"]: np.asarray(r["vector"], np.float32) for r in rows}


def test_lancedb_ranks_and_scores_a_table_of_pages_as_maxsim_over_its_vectors(tmp_path):
    url = f"lancedb://{tmp_path}/db?table=pages"
    _load(url, _pages(30, seed=1))
    stored = _stored(f"{tmp_path}/db", "pages")
    ids = list(stored)
    store = SearchStore(sink_for(url))
    assert asyncio.run(store.shape(DEADLINE)) == MULTI
    rng = np.random.default_rng(2)
    for tokens in (1, 5, 23):
        query = _unit(rng.standard_normal((tokens, DIM)))
        order, scores = ranked(maxsim(query, list(stored.values())), None)
        hits = asyncio.run(store.search("pages-model", query, len(ids), {}, DEADLINE))
        assert [h.id for h in hits] == [ids[i] for i in order.tolist()]
        np.testing.assert_allclose([h.score for h in hits], scores, rtol=1e-4)
        assert [h.metadata for h in hits] == [{"n": int(ids[i][1:])} for i in order.tolist()]
        assert all(h.text is None and h.chunk is None for h in hits)
        top = asyncio.run(store.search("pages-model", query, 4, {}, DEADLINE))
        assert [h.id for h in top] == [h.id for h in hits[:4]]
    asyncio.run(store.close())


def test_a_table_of_pages_refuses_other_widths_and_filters(tmp_path):
    url = f"lancedb://{tmp_path}/db?table=pages"
    _load(url, _pages(4, seed=3))
    store = SearchStore(sink_for(url))
    wide = _refusal(store.search("wide-model", np.ones((3, 2 * DIM), np.float32), 3, {}, DEADLINE))
    assert (wide.code, wide.param) == (ErrorCode.INVALID_REQUEST, "model")
    assert wide.message.startswith(f"wide-model makes vectors of {2 * DIM} dimensions; the search store lancedb://")
    filtered = _refusal(store.search("m", _pages(1, seed=4)[0], 3, {"n": 1}, DEADLINE))
    assert (filtered.code, filtered.param) == (ErrorCode.INVALID_REQUEST, "filter")
    assert "without filters" in filtered.message
    asyncio.run(store.close())


def test_a_qdrant_collection_of_pages_is_ranked_and_scored_as_maxsim_with_filters(tmp_path):
    url = f"qdrant://{tmp_path}/qdrant?collection=pages"
    pages = _pages(30, seed=5)  # unit rows: Qdrant's cosine keeps them as they are
    _load(url, pages)  # closed: local mode opens a folder in one client at a time
    ids = [f"p{i}" for i in range(len(pages))]
    store = SearchStore(sink_for(url))
    assert asyncio.run(store.shape(DEADLINE)) == MULTI
    rng = np.random.default_rng(6)
    for tokens in (1, 7, 23):
        query = _unit(rng.standard_normal((tokens, DIM)))
        order, scores = ranked(maxsim(query, pages), None)
        hits = asyncio.run(store.search("pages-model", query, len(ids), {}, DEADLINE))
        assert [h.id for h in hits] == [ids[i] for i in order.tolist()]
        np.testing.assert_allclose([h.score for h in hits], scores, rtol=1e-4)
        assert [h.metadata for h in hits] == [{"n": i} for i in order.tolist()]
        assert all(h.text is None and h.chunk is None for h in hits)
        last = int(order[-1])  # the worst page: found only when the filter applies before the top 4
        filtered = asyncio.run(store.search("pages-model", query, 4, {"n": last}, DEADLINE))
        assert [(h.id, h.metadata) for h in filtered] == [(ids[last], {"n": last})]
        assert filtered[0].score == pytest.approx(float(scores[-1]), rel=1e-4)
    wide = _refusal(store.search("wide-model", np.ones((3, 2 * DIM), np.float32), 3, {}, DEADLINE))
    assert (wide.code, wide.param) == (ErrorCode.INVALID_REQUEST, "model")
    asyncio.run(store.close())


def test_a_store_that_cannot_search_multi_vectors_is_refused_naming_those_that_can(monkeypatch):
    # pgvector has no multi-vector column (a load of pages is refused there): a table that attached as one
    # anyway is refused before any search reaches it
    sink = sink_for("postgresql://reader:pw@127.0.0.1:1/docs?table=pages")
    assert not getattr(sink, "searches_multivector", False)
    monkeypatch.setattr(sink, "attach", lambda: MULTI)
    store = SearchStore(sink)
    refused = _refusal(store.shape(DEADLINE))
    assert refused.code is ErrorCode.NO_RESPONDERS
    assert refused.message == (
        f"the search store {store.shown} holds multi-vectors (a vector per token of each row); they are "
        "searched (by MaxSim) in LanceDB tables and Qdrant collections: load the job into one"
    )
    assert "pw" not in refused.message
    asyncio.run(store.close())


@pytest.mark.parametrize(
    ("makes", "shape", "expected"),
    [
        (("multivector",), MULTI, "multivector"),
        (("dense", "sparse", "multivector"), MULTI, "multivector"),  # a model of several heads: the table's
        (("dense", "multivector"), Shape("float32", "dense", DIM), "dense"),
        ((), MULTI, "multivector"),  # no worker seen: the embed call answers for itself
    ],
)
def test_the_query_is_embedded_as_the_table_s_rows(makes, shape, expected):
    assert query_output("m", makes, shape, "lancedb:///db?table=t") == expected


def test_a_model_that_cannot_make_the_table_s_rows_is_refused_naming_it():
    dense = _refusal_of(query_output, "mini", ("dense",), MULTI, "lancedb:///db?table=pages")
    assert (dense.code, dense.param) == (ErrorCode.INVALID_REQUEST, "model")
    assert dense.message == (
        "mini makes no multi-vectors (it makes: dense); the search store lancedb:///db?table=pages holds a "
        "vector per token of each row, searched by MaxSim: search with the multi-vector model that filled it"
    )
    pages = _refusal_of(query_output, "colqwen2", ("multivector",), Shape("float32", "dense", 128), "lancedb:///d")
    assert (pages.code, pages.param) == (ErrorCode.INVALID_REQUEST, "model")
    assert pages.message == (
        "colqwen2 makes no dense vectors (it makes: multivector); the search store lancedb:///d holds dense "
        "vectors: search with the model that filled it"
    )


def _refusal_of(function, *args) -> ApiError:
    with pytest.raises(ApiError) as err:
        function(*args)
    return err.value
