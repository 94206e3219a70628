"""The pgvector sink against a real PostgreSQL with pgvector (pgserver ships both): tables made and
checked, upserts that write each key once, the index, search with and without a filter, and the
store's errors with their passwords hidden."""

from __future__ import annotations

import numpy as np
import pytest

from embedfleet.shared.sinks.base import Rows, Shape, SinkError
from embedfleet.shared.sinks.pgvector import PgVectorSink
from tests.conftest import unit_rows


def test_upserts_write_each_id_once_and_search_finds_the_exact_neighbours(postgres_uri):
    sink = PgVectorSink(f"{postgres_uri}&table=docs")
    sink.open(Shape("float32", "dense", 16))
    vectors, ids = unit_rows(600, 16), [f"doc-{i}" for i in range(600)]
    for start in range(0, 600, 200):
        sink.write(
            Rows(
                ids[start : start + 200],
                vectors[start : start + 200],
                [{"lang": "en" if i % 2 else "de", "n": i} for i in range(start, start + 200)],
                texts=[f"text of {i}" for i in range(start, start + 200)],
            )
        )
    sink.write(
        Rows(
            ids[:200],
            vectors[:200],
            [{"lang": "en" if i % 2 else "de", "n": i} for i in range(200)],
            texts=[f"text of {i}" for i in range(200)],
        )
    )  # again
    sink.write(Rows(["doc-7", "doc-7"], vectors[[8, 7]], None))  # a key twice in one batch: the last wins
    assert sink.count() == 600
    sink.finish()
    exact = np.argsort(-(vectors @ vectors[7]))[:10]
    hits = sink.search(vectors[7], 10)
    assert [h.id for h in hits][:1] == ["doc-7"] and hits[0].score == pytest.approx(1.0, abs=1e-6)
    assert (
        all(h.text == f"text of {h.id.removeprefix('doc-')}" for h in hits[1:]) and hits[0].text is None
    )  # doc-7: rewritten without
    assert len({h.id for h in hits} & {ids[i] for i in exact}) >= 9  # HNSW: recall@10 >= 0.9 on 600 rows
    assert hits[1].score == pytest.approx(float(vectors[exact[1]] @ vectors[7]), abs=1e-5)
    german = sink.search(vectors[7], 5, {"lang": "de"})
    assert len(german) == 5 and all(h.metadata["lang"] == "de" and h.metadata["n"] % 2 == 0 for h in german)
    sink.close()
    again = PgVectorSink(f"{postgres_uri}&table=docs")  # a later job's sink on the same table
    again.open(Shape("float32", "dense", 16))
    assert again.count() == 600
    reader = PgVectorSink(f"{postgres_uri}&table=docs")  # a search's: the table as the load left it
    assert reader.attach() == Shape("float32", "dense", 16)
    assert [(h.id, h.text) for h in reader.search(vectors[9], 1)] == [("doc-9", "text of 9")]


def test_attach_reads_what_a_table_holds_and_never_makes_one(postgres_uri):
    sink = PgVectorSink(f"{postgres_uri}&table=Chunked")  # a name in capitals is one table, not two
    sink.open(Shape("float32", "dense", 8, chunked=True))
    sink.write(Rows(["a"], unit_rows(1, 8), [{"k": 1}], [(2, 0, 6)], ["a text"]))
    reader = PgVectorSink(f"{postgres_uri}&table=Chunked")
    assert reader.attach() == Shape("float32", "dense", 8, chunked=True)
    (hit,) = reader.search(unit_rows(1, 8)[0], 5)
    assert (hit.id, hit.chunk, hit.text, hit.metadata) == ("a", 2, "a text", {"k": 1})
    with pytest.raises(SinkError, match="no table nowhere: load one first") as err:
        PgVectorSink(f"{postgres_uri}&table=nowhere").attach()
    assert not err.value.retryable
    with pytest.raises(SinkError, match="no table nowhere"):
        PgVectorSink(f"{postgres_uri}&table=nowhere").attach()  # still none: the first attach made nothing


def test_chunk_rows_are_keyed_by_id_and_chunk(postgres_uri):
    sink = PgVectorSink(f"{postgres_uri}&table=chunks&index=none")
    sink.open(Shape("float32", "dense", 8, chunked=True))
    v = unit_rows(3, 8)
    sink.write(Rows(["a", "a", "b"], v, None, [(0, 0, 10), (1, 8, 20), (0, 0, 5)]))
    sink.write(Rows(["a"], v[1:2], None, [(1, 8, 20)]))
    assert sink.count() == 3
    sink.finish()  # index=none: nothing to build
    hits = sink.search(v[1], 1)
    assert (hits[0].id, hits[0].chunk) == ("a", 1)


def test_a_table_of_another_shape_is_refused_with_what_it_holds(postgres_uri):
    PgVectorSink(f"{postgres_uri}&table=shaped").open(Shape("float32", "dense", 8))
    with pytest.raises(SinkError, match=r"holds embedding vector\(8\); this job makes vector\(16\)") as err:
        PgVectorSink(f"{postgres_uri}&table=shaped").open(Shape("float32", "dense", 16))
    assert not err.value.retryable
    with pytest.raises(SinkError, match="has no chunk column"):
        PgVectorSink(f"{postgres_uri}&table=shaped").open(Shape("float32", "dense", 8, chunked=True))
    with pytest.raises(SinkError, match="no int8 vectors"):
        PgVectorSink(f"{postgres_uri}&table=other").open(Shape("int8", "dense", 8))
    with pytest.raises(SinkError, match="no multi-vector column"):
        PgVectorSink(f"{postgres_uri}&table=other").open(Shape("float32", "multivector", 8))


@pytest.mark.parametrize(
    "shape, kind",
    [
        (Shape("float16", "dense", 8), "halfvec"),
        (Shape("binary", "dense", 64), "bit"),
        (Shape("float32", "sparse", 30522), "sparsevec"),
    ],
)
def test_a_column_the_servers_pgvector_lacks_is_refused_with_its_version(postgres_uri, shape, kind):
    """The types pgvector 0.7 brought (halfvec, sparsevec, HNSW over bits) on a server with an older one
    (pgserver ships 0.6.2): refused for good, naming both versions, no table made. With 0.7 or later the
    same shapes make their tables."""
    import psycopg

    with psycopg.connect(postgres_uri) as conn:
        version = conn.execute("SELECT default_version FROM pg_available_extensions WHERE name = 'vector'").fetchone()[
            0
        ]
    if tuple(int(p) for p in version.split(".")[:2]) >= (0, 7):
        sink = PgVectorSink(f"{postgres_uri}&table=new_{kind}")
        sink.open(shape)
        sink.close()
        return
    with pytest.raises(SinkError, match=rf"pgvector is {version}; {kind} columns need pgvector 0\.7 or later") as err:
        PgVectorSink(f"{postgres_uri}&table=new_{kind}").open(shape)
    assert not err.value.retryable
    with psycopg.connect(postgres_uri) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (f"new_{kind}",)).fetchone()[0] is None


def test_a_socket_folder_with_a_space_in_its_path_is_reached(postgres_uri, tmp_path):
    """host= names the socket's folder; a space in its path, written %20 or as is, reaches the server
    (here a link to the server's socket folder: PostgreSQL itself would take such a path too)."""
    from urllib.parse import parse_qs, quote, urlsplit

    spaced = tmp_path / "my notes"
    spaced.symlink_to(parse_qs(urlsplit(postgres_uri).query)["host"][0])
    for host in (quote(str(spaced)), str(spaced)):
        sink = PgVectorSink(f"postgresql://postgres@/postgres?host={host}&table=spaced")
        sink.open(Shape("float32", "dense", 4))
        assert sink.count() == 0
        sink.close()


def test_bad_urls_are_refused_before_connecting():
    with pytest.raises(SinkError, match="not a plain table name"):
        PgVectorSink("postgresql://u@h:5432/db?table=x;drop")
    with pytest.raises(SinkError, match="index='ivf'"):
        PgVectorSink("postgresql://u@h:5432/db?table=x&index=ivf")


def test_a_store_that_is_down_is_retryable_and_its_password_never_shown():
    sink = PgVectorSink("postgresql://user:s3cret-pw@127.0.0.1:1/db?table=x")
    assert sink.shown == "postgresql://user:***@127.0.0.1:1/db?table=x"
    with pytest.raises(SinkError) as err:
        sink.open(Shape("float32", "dense", 8))
    assert err.value.retryable and "s3cret-pw" not in str(err.value) and "127.0.0.1" in str(err.value)
