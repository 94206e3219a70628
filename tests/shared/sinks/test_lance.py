"""The LanceDB sink on disk: tables made and checked, merge-inserts that write each key once, every
vector form it takes, search."""

from __future__ import annotations

import numpy as np
import pytest

from embedfleet.shared.sinks.base import Rows, Shape, SinkError
from embedfleet.shared.sinks.lance import LanceSink
from embedfleet.shared.vectors.quantize import quantize
from tests.conftest import unit_rows


def test_merge_inserts_write_each_id_once_and_search_ranks_by_cosine(tmp_path):
    sink = LanceSink(f"lancedb://{tmp_path}/db?table=docs")
    sink.open(Shape("float32", "dense", 16))
    vectors, ids = unit_rows(300, 16), [f"doc-{i}" for i in range(300)]
    texts = [f"text of {i}" for i in range(300)]
    for start in range(0, 300, 100):
        sink.write(
            Rows(
                ids[start : start + 100],
                vectors[start : start + 100],
                [{"n": i} for i in range(start, start + 100)],
                texts=texts[start : start + 100],
            )
        )
    sink.write(Rows(ids[:100], vectors[:100], [{"n": i} for i in range(100)], texts=texts[:100]))  # delivered again
    sink.write(Rows(["doc-3", "doc-3"], vectors[[4, 3]], None))  # a key twice in one batch: the last wins
    assert sink.count() == 300
    sink.finish()
    hits = sink.search(vectors[3], 5)
    exact = np.argsort(-(vectors @ vectors[3]))[:5]
    assert [h.id for h in hits] == [ids[i] for i in exact]  # no index: exact search
    assert hits[1].score == pytest.approx(float(vectors[exact[1]] @ vectors[3]), abs=1e-5)
    assert [h.text for h in hits] == [texts[i] if i != 3 else None for i in exact]  # doc-3: rewritten without
    assert sink.search(vectors[10], 1)[0].metadata == {"n": 10}
    again = LanceSink(f"lancedb://{tmp_path}/db?table=docs")
    again.open(Shape("float32", "dense", 16))
    assert again.count() == 300
    reader = LanceSink(f"lancedb://{tmp_path}/db?table=docs")  # a search's: the table as the load left it
    assert reader.attach() == Shape("float32", "dense", 16)
    assert [(h.id, h.text) for h in reader.search(vectors[10], 1)] == [("doc-10", "text of 10")]


@pytest.mark.parametrize(
    "shape",
    [Shape("float16", "dense", 8, chunked=True), Shape("ubinary", "dense", 16), Shape("float32", "multivector", 8)],
)
def test_attach_reads_what_a_table_holds_and_never_makes_one(tmp_path, shape):
    LanceSink(f"lancedb://{tmp_path}/db?table=t").open(shape)
    assert LanceSink(f"lancedb://{tmp_path}/db?table=t").attach() == shape
    with pytest.raises(SinkError, match="no table other: load one first") as err:
        LanceSink(f"lancedb://{tmp_path}/db?table=other").attach()
    assert not err.value.retryable
    assert not (tmp_path / "db" / "other.lance").exists()


@pytest.mark.parametrize("form", ["float16", "binary", "ubinary"])
def test_each_form_it_takes_round_trips(tmp_path, form):
    v = unit_rows(4, 16)
    sink = LanceSink(f"lancedb://{tmp_path}/db?table=t")
    sink.open(Shape(form, "dense", 16, chunked=True))
    rows = quantize(v, form)
    sink.write(Rows(["a", "a", "b", "c"], rows, None, [(0, 0, 4), (1, 3, 9), (0, 0, 2), (0, 0, 7)]))
    assert sink.count() == 4
    stored = sink._table.to_arrow().sort_by([("id", "ascending"), ("chunk", "ascending")])
    got = np.array(stored["vector"].to_pylist())
    if form == "float16":
        np.testing.assert_array_equal(got, rows.astype(np.float32))
    else:  # packed bits, unshifted
        np.testing.assert_array_equal(got, np.packbits(v > 0, axis=1))


def test_multi_vector_rows(tmp_path):
    sink = LanceSink(f"lancedb://{tmp_path}/db?table=mv")
    sink.open(Shape("float32", "multivector", 8))
    sink.write(Rows(["a", "b"], [unit_rows(3, 8), unit_rows(5, 8, 1)]))
    assert sink.count() == 2
    lengths = sorted(len(x) for x in sink._table.to_arrow()["vector"].to_pylist())
    assert lengths == [3, 5]


def test_what_it_cannot_take_is_refused(tmp_path):
    LanceSink(f"lancedb://{tmp_path}/db?table=t").open(Shape("float32", "dense", 8))
    with pytest.raises(SinkError, match="another layout") as err:
        LanceSink(f"lancedb://{tmp_path}/db?table=t").open(Shape("float32", "dense", 16))
    assert not err.value.retryable
    with pytest.raises(SinkError, match="not sparse"):
        LanceSink(f"lancedb://{tmp_path}/db?table=s").open(Shape("float32", "sparse", 30522))
    with pytest.raises(SinkError, match="not int8"):
        LanceSink(f"lancedb://{tmp_path}/db?table=s").open(Shape("int8", "dense", 8))
    with pytest.raises(SinkError, match="names a folder on this machine"):
        LanceSink("lancedb://host/db?table=t")
    with pytest.raises(SinkError, match="unknown LanceDB URL parameters mode"):
        LanceSink(f"lancedb://{tmp_path}/db?table=t&mode=x")


def test_a_sink_is_chosen_by_its_scheme(tmp_path):
    from embedfleet.shared.sinks import sink_for
    from embedfleet.shared.sinks.pgvector import PgVectorSink
    from embedfleet.shared.sinks.qdrant import QdrantSink

    assert isinstance(sink_for(f"lancedb://{tmp_path}/db?table=t"), LanceSink)
    assert isinstance(sink_for("postgresql://u@localhost:5432/db?table=t"), PgVectorSink)
    assert isinstance(sink_for("qdrant://localhost:6333?collection=c"), QdrantSink)
    with pytest.raises(SinkError, match="unknown sink 'mysql://'"):
        sink_for("mysql://localhost/db")
