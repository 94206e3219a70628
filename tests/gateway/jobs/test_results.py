"""GET /v1/jobs/{id}/results' pieces in-process: the Accept negotiation, the NDJSON lines and the
Parquet stream of each output kind and form (the route on a real stack: tests/integration/test_job_results.py)."""

from __future__ import annotations

import io

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.jobs.parquet import ParquetStream
from embedfleet.services.gateway.jobs.results import ndjson_lines, negotiate
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.jobs.results import JobForm, Stored, unfinished
from embedfleet.shared.jobs.state import JobState
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking


@pytest.mark.parametrize(
    "accept, kind",
    [
        (None, "ndjson"),
        ("*/*", "ndjson"),
        ("application/*", "ndjson"),
        ("application/x-ndjson", "ndjson"),
        ("application/vnd.apache.parquet", "parquet"),
        ("application/x-parquet", "parquet"),
        ("text/csv, application/x-parquet;q=0.5", "parquet"),
        ("application/x-ndjson;q=0.2, application/vnd.apache.parquet", "parquet"),
        ("application/vnd.apache.parquet;q=0, */*", "ndjson"),
        ("Application/X-NDJSON; charset=utf-8", "ndjson"),
    ],
)
def test_accept_picks_the_form(accept, kind):
    assert negotiate(accept) == kind


@pytest.mark.parametrize(
    "accept", ["application/json", "text/csv", "application/x-ndjson;q=0", "application/x-parquet;q=x"]
)
def test_an_accept_naming_nothing_served_is_a_406(accept):
    with pytest.raises(ApiError) as caught:
        negotiate(accept)
    assert caught.value.code == ErrorCode.NOT_ACCEPTABLE and caught.value.status == 406
    assert "application/x-ndjson" in caught.value.message and accept in caught.value.message


def _dense(form: str, rows: np.ndarray) -> Stored:
    return Stored(batch=0, start=0, doc_ids=[f"d{i}" for i in range(len(rows))], rows=rows, dim=rows.shape[1])


def test_dense_lines_give_floats_for_float_forms_and_integers_for_quantized_ones():
    floats = np.array([[0.25, -1.5], [3.0, 0.1]], dtype="<f4")
    lines = [orjson.loads(line) for line in ndjson_lines(_dense("float32", floats), "dense").splitlines()]
    assert [line["id"] for line in lines] == ["d0", "d1"]
    # each float32 written as the shortest decimal that reads back as the same float32
    assert np.array_equal(np.array([line["vector"] for line in lines], dtype="<f4"), floats)
    halves = [
        orjson.loads(line) for line in ndjson_lines(_dense("float16", floats.astype("<f2")), "dense").splitlines()
    ]
    assert np.array_equal(np.array([line["vector"] for line in halves], dtype="<f2"), floats.astype("<f2"))
    packed = np.array([[-128, 127], [5, 0]], dtype=np.int8)
    assert (
        ndjson_lines(_dense("binary", packed), "dense")
        == b'{"id":"d0","vector":[-128,127]}\n{"id":"d1","vector":[5,0]}\n'
    )


def test_sparse_and_multivector_lines():
    sparse = Stored(
        3,
        7,
        ["a", "b"],
        [(np.array([2, 9], np.int32), np.array([0.5, 1.25], "<f4")), (np.zeros(0, np.int32), np.zeros(0, "<f4"))],
        30,
    )
    assert ndjson_lines(sparse, "sparse") == (
        b'{"id":"a","vector":{"indices":[2,9],"values":[0.5,1.25]}}\n{"id":"b","vector":{"indices":[],"values":[]}}\n'
    )
    multi = Stored(0, 0, ["m"], [np.array([[1, -2], [3, 4]], np.int8)], 2)
    assert ndjson_lines(multi, "multivector") == b'{"id":"m","vector":[[1,-2],[3,4]]}\n'


def _parquet(form: JobForm, parts: list[Stored], dim: int, monkeypatch, group: int = 3) -> tuple[bytes, int]:
    """The whole Parquet file the stream hands out, and how many pieces came before its last."""
    monkeypatch.setattr("embedfleet.services.gateway.jobs.parquet.ROW_GROUP", group)
    stream = ParquetStream(form)
    pieces = [data for part in parts if (data := stream.add(part))]
    return b"".join(pieces) + stream.finish(dim), len(pieces)


def test_dense_parquet_has_reindex_columns_and_is_handed_out_a_row_group_at_a_time(monkeypatch, tmp_path):
    from embedfleet.services.jobs.files import write_output

    rows = np.arange(8 * 4, dtype=np.int8).reshape(8, 4)
    parts = [Stored(i, 0, [f"d{2 * i}", f"d{2 * i + 1}"], rows[2 * i : 2 * i + 2], 4) for i in range(4)]
    data, early = _parquet(JobForm("int8", "dense"), parts, 4, monkeypatch)
    assert early == 2  # after 4 and 8 documents (groups of 3 or more): bytes went out before the end
    table = pq.read_table(io.BytesIO(data))
    write_output(tmp_path / "ref.parquet", [f"d{i}" for i in range(8)], rows, "int8", 4)
    reference = pq.read_table(tmp_path / "ref.parquet")
    assert table.schema.types == reference.schema.types and table.column_names == ["id", "vector"]
    assert table.to_pylist() == reference.to_pylist()
    meta = table.schema.metadata
    assert (meta[b"embedding_type"], meta[b"dim"], meta[b"output"]) == (b"int8", b"4", b"dense")
    assert pq.ParquetFile(io.BytesIO(data)).num_row_groups == 2


def test_sparse_and_multivector_parquet(monkeypatch):
    sparse = Stored(0, 0, ["a"], [(np.array([2, 9], np.int32), np.array([0.5, 1.25], "<f2"))], 30)
    table = pq.read_table(io.BytesIO(_parquet(JobForm("float16", "sparse"), [sparse], 30, monkeypatch)[0]))
    assert table.to_pylist() == [{"id": "a", "vector": {"indices": [2, 9], "values": [0.5, 1.25]}}]
    vector = table.schema.field("vector").type
    assert (vector.field("indices").type.value_type, vector.field("values").type.value_type) == (
        pa.int32(),
        pa.float16(),
    )
    multi = Stored(0, 0, ["m", "n"], [np.array([[1.0, -2.0]], "<f4"), np.array([[3.0, 4.0], [5.0, 6.0]], "<f4")], 2)
    table = pq.read_table(io.BytesIO(_parquet(JobForm("float32", "multivector"), [multi], 2, monkeypatch)[0]))
    assert table.to_pylist() == [{"id": "m", "vector": [[1.0, -2.0]]}, {"id": "n", "vector": [[3.0, 4.0], [5.0, 6.0]]}]


def test_a_job_without_stored_rows_is_an_empty_file(monkeypatch):
    table = pq.read_table(io.BytesIO(_parquet(JobForm("float32", "dense"), [], 0, monkeypatch)[0]))
    assert table.num_rows == 0 and table.column_names == ["id", "vector"]


def test_only_a_finished_job_is_read():
    assert unfinished(JobState("j", status="done")) is None
    assert unfinished(JobState("j", status="cancelled")) is None
    said = unfinished(JobState("j", status="running", documents=40, done=16))
    assert said == "job j is running: 16 of 40 documents settled; its results can be read once it is done"


def _chunked(texts: list[str] | None) -> Stored:
    from embedfleet.shared.protocol import ChunkRows

    rows = np.array([[0.5, 1.0], [2.0, -1.0]], dtype="<f4")
    chunks = ChunkRows.of(1, [(0, 0, 2, 0, 4), (0, 1, 2, 3, 9)], texts)
    return Stored(0, 0, ["a", "a"], rows, 2, chunks)


def test_a_chunked_jobs_lines_are_a_chunk_each_with_its_place():
    assert ndjson_lines(_chunked(None), "dense") == (
        b'{"id":"a","chunk":0,"start":0,"end":4,"vector":[0.5,1.0]}\n'
        b'{"id":"a","chunk":1,"start":3,"end":9,"vector":[2.0,-1.0]}\n'
    )
    lines = [orjson.loads(line) for line in ndjson_lines(_chunked(["abcd", "defghi"]), "dense").splitlines()]
    assert [line["text"] for line in lines] == ["abcd", "defghi"]


@pytest.mark.parametrize("with_text", [False, True])
def test_a_chunked_jobs_parquet_has_the_chunk_columns(with_text):
    chunking = JobChunking(ChunkSpec(8, 2), with_text=with_text)
    stream = ParquetStream(JobForm("float32", "dense", chunking))
    data = stream.add(_chunked(["abcd", "defghi"] if with_text else None)) + stream.finish(2)
    table = pq.read_table(io.BytesIO(data))
    assert table.column_names == ["id", "chunk", "start", "end", "vector"] + (["text"] if with_text else [])
    assert table.select(["id", "chunk", "start", "end"]).to_pylist() == [
        {"id": "a", "chunk": 0, "start": 0, "end": 4},
        {"id": "a", "chunk": 1, "start": 3, "end": 9},
    ]
    assert table.column("vector").to_pylist() == [[0.5, 1.0], [2.0, -1.0]]
    assert orjson.loads(table.schema.metadata[b"chunking"]) == {
        "size": 8,
        "overlap": 2,
        "boundary": "token",
        "late": False,
        "with_text": with_text,
    }
    if with_text:
        assert table.column("text").to_pylist() == ["abcd", "defghi"]
