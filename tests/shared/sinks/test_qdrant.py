"""The Qdrant sink in qdrant-client's local mode (a folder): collections made and checked, upserts that
write each key once, dense, sparse and multi-vector points, search with and without a filter (dense by
cosine, multi-vectors by MaxSim computed here over the stored vectors)."""

from __future__ import annotations

import numpy as np
import pytest

from embedfleet.shared.sinks.base import Rows, Shape, SinkError
from embedfleet.shared.sinks.qdrant import QdrantSink, point_id
from tests.conftest import unit_rows


def test_upserts_write_each_id_once_and_search_ranks_by_cosine_with_filters(tmp_path):
    sink = QdrantSink(f"qdrant://{tmp_path}/q?collection=docs")
    assert sink.shown == f"qdrant://{tmp_path}/q?collection=docs"
    sink.open(Shape("float32", "dense", 16))
    vectors, ids = unit_rows(300, 16), [f"doc-{i}" for i in range(300)]
    meta = [{"lang": "en" if i % 2 else "de", "n": i} for i in range(300)]
    texts = [f"text of {i}" for i in range(300)]
    for start in range(0, 300, 100):
        sink.write(
            Rows(
                ids[start : start + 100],
                vectors[start : start + 100],
                meta[start : start + 100],
                texts=texts[start : start + 100],
            )
        )
    sink.write(Rows(ids[:100], vectors[:100], meta[:100], texts=texts[:100]))  # delivered again
    assert sink.count() == 300
    sink.finish()
    hits = sink.search(vectors[3], 5)
    exact = np.argsort(-(vectors @ vectors[3]))[:5]
    assert [h.id for h in hits] == [ids[i] for i in exact]
    assert hits[1].score == pytest.approx(float(vectors[exact[1]] @ vectors[3]), abs=1e-5)
    assert [h.text for h in hits] == [texts[i] for i in exact]
    english = sink.search(vectors[3], 4, {"lang": "en"})
    assert len(english) == 4 and all(h.metadata["n"] % 2 == 1 for h in english)
    sink.close()
    reader = QdrantSink(f"qdrant://{tmp_path}/q?collection=docs")  # a search's: the collection as the load left it
    assert reader.attach() == Shape("float32", "dense", 16)
    assert [(h.id, h.text) for h in reader.search(vectors[10], 1)] == [("doc-10", "text of 10")]
    reader.close()  # local mode: one client a folder
    other = QdrantSink(f"qdrant://{tmp_path}/q?collection=other")
    with pytest.raises(SinkError, match="no collection other: load one first") as err:
        other.attach()
    assert not err.value.retryable and not other._connect().collection_exists("other")
    other.close()


def test_attach_reads_chunks_sparse_and_multi_vector_collections(tmp_path):
    shapes = {
        "chunks": Shape("float16", "dense", 8, chunked=True),
        "sparse": Shape("float32", "sparse", 0),
        "mv": Shape("float32", "multivector", 8),
    }
    for name, shape in shapes.items():
        sink = QdrantSink(f"qdrant://{tmp_path}/{name}?collection={name}")
        sink.open(shape)
        if shape.chunked:  # a collection says nothing of chunks: its points' payload does
            sink.write(Rows(["a"], unit_rows(1, 8), None, [(0, 0, 4)], ["a text"]))
        sink.close()
        reader = QdrantSink(f"qdrant://{tmp_path}/{name}?collection={name}")
        assert reader.attach() == shape
        reader.close()


def test_chunks_sparse_and_multi_vector_points(tmp_path):
    chunks = QdrantSink(f"qdrant://{tmp_path}/q?collection=chunks")
    chunks.open(Shape("float16", "dense", 8, chunked=True))
    v = unit_rows(3, 8)
    chunks.write(Rows(["a", "a", "b"], v, None, [(0, 0, 4), (1, 3, 9), (0, 0, 2)]))
    chunks.write(Rows(["a"], v[1:2], None, [(1, 3, 9)]))
    assert chunks.count() == 3 and point_id("a", 0) != point_id("a", 1) != point_id("a", None)
    top = chunks.search(v[1], 1)[0]
    assert (top.id, top.chunk) == ("a", 1)
    chunks.close()
    sparse = QdrantSink(f"qdrant://{tmp_path}/q2?collection=sparse")
    sparse.open(Shape("float32", "sparse", 30522))
    sparse.write(Rows(["s1", "s2"], [(np.array([3, 70]), np.array([0.5, 1.5])), (np.array([9]), np.array([2.0]))]))
    assert sparse.count() == 2
    sparse.close()
    multi = QdrantSink(f"qdrant://{tmp_path}/q3?collection=mv")
    multi.open(Shape("float32", "multivector", 8))
    multi.write(Rows(["m1", "m2"], [unit_rows(3, 8), unit_rows(5, 8, 1)]))
    assert multi.count() == 2
    multi.close()


def _maxsim(query: np.ndarray, page: np.ndarray) -> float:
    """Late interaction by hand: for each of the query's rows [q, dim] its largest cosine with the page's
    rows [tokens, dim], summed."""
    cosines = (query @ page.T) / np.outer(np.linalg.norm(query, axis=1), np.linalg.norm(page, axis=1))
    return float(cosines.max(axis=1).sum())


def test_a_multi_vector_collection_is_searched_by_maxsim_with_filters(tmp_path):
    rng = np.random.default_rng(7)
    # not unit length (Qdrant's cosine normalises), 1 to 30 vectors a document
    pages = [rng.standard_normal((int(rng.integers(1, 31)), 8)).astype(np.float32) * 3 for _ in range(40)]
    ids, meta = [f"m{i}" for i in range(40)], [{"half": i % 2, "n": i} for i in range(40)]
    sink = QdrantSink(f"qdrant://{tmp_path}/q?collection=mv")
    sink.open(Shape("float32", "multivector", 8))
    sink.write(Rows(ids, pages, meta))
    sink.close()
    reader = QdrantSink(f"qdrant://{tmp_path}/q?collection=mv")  # a search's, as the gateway's
    assert reader.attach() == Shape("float32", "multivector", 8) and reader.searches_multivector
    for tokens in (1, 4, 17):
        query = rng.standard_normal((tokens, 8)).astype(np.float32)
        scores = np.array([_maxsim(query, page) for page in pages])
        order = np.argsort(-scores, kind="stable")
        hits = reader.search(query, 40)
        assert [h.id for h in hits] == [ids[i] for i in order]
        np.testing.assert_allclose([h.score for h in hits], scores[order], rtol=1e-4)
        assert [h.metadata for h in hits] == [meta[i] for i in order]
        assert all(h.chunk is None and h.text is None for h in hits)
        odd = reader.search(query, 5, {"half": 1})
        kept = [i for i in order if i % 2 == 1][:5]
        assert [h.id for h in odd] == [ids[i] for i in kept]
        np.testing.assert_allclose([h.score for h in odd], scores[kept], rtol=1e-4)
    with pytest.raises(SinkError) as err:
        reader.search(query[0], 3)  # one vector: a dense query
    assert err.value.message == (
        "collection mv holds multivector vectors, searched by the query's token vectors [tokens, dim]: "
        "a query of shape [8] was given"
    )
    assert not err.value.retryable
    reader.close()
    dense = QdrantSink(f"qdrant://{tmp_path}/q2?collection=dense")
    dense.open(Shape("float32", "dense", 8))
    dense.write(Rows(["d"], unit_rows(1, 8)))
    with pytest.raises(SinkError) as err:
        dense.search(unit_rows(3, 8), 3)
    assert err.value.message == (
        "collection dense holds dense vectors, searched by one vector [dim]: a query of shape [3, 8] was given"
    )
    assert not err.value.retryable
    dense.close()


def test_what_it_cannot_take_is_refused(tmp_path):
    QdrantSink(f"qdrant://{tmp_path}/q?collection=t").open(Shape("float32", "dense", 8))
    with pytest.raises(SinkError, match="has no dense vector of 16 dimensions") as err:
        s = QdrantSink(f"qdrant://{tmp_path}/q?collection=t")
        try:
            s.open(Shape("float32", "dense", 16))
        finally:
            s.close()
    assert not err.value.retryable
    with pytest.raises(SinkError, match="not binary"):
        QdrantSink(f"qdrant://{tmp_path}/q4?collection=b").open(Shape("binary", "dense", 8))
    with pytest.raises(SinkError, match="unknown Qdrant URL parameters api_key"):
        QdrantSink("qdrant://localhost:6333?collection=t&api_key=x")


def test_a_server_that_is_down_is_retryable_and_its_key_never_shown(tmp_path, monkeypatch):
    monkeypatch.setenv("QDRANT_API_KEY", "k3y-secret")
    sink = QdrantSink("qdrant://127.0.0.1:1?collection=t")
    assert sink.shown == "qdrant://127.0.0.1:1?collection=t"
    with pytest.raises(SinkError) as err:
        sink.open(Shape("float32", "dense", 8))
    assert err.value.retryable and "k3y-secret" not in str(err.value)
