"""reindex --sink on real stores, real processes, the real model: pgvector (PostgreSQL from pgserver),
LanceDB on disk and Qdrant's local mode. A worker SIGKILLed mid-job of 1,000 documents still leaves every id in the
store exactly once with the sentence-transformers vector and the input's other fields; a chunked job
is keyed by (id, chunk); PostgreSQL stopped mid-job makes the job wait (the job state says why) and
finish once it is back; a bad URL or a table of another dimension ends reindex before anything is
published."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pgserver
import pytest

from embedfleet.shared.nats.server import EmbeddedNats
from tests.conftest import COSINE_TOLERANCE, cosines, stop_postgres
from tests.integration.test_job_faults import FaultStack, _state, _stored_ids
from tests.support.corpus import mixed_texts
from tests.support.procs import running, wait_until

pytestmark = pytest.mark.integration

DOCUMENTS = 400  # the job a worker is killed in, into each store (some 20 batches run after the kill)
BATCH = 16
SAMPLE = 100  # documents whose vectors are compared with the reference
CHUNKED = (
    96  # documents of the chunked job (its first ones, 12 whole help topics): many chunks each, keyed the same way
)
PAUSED = 300  # documents of the job whose PostgreSQL stops (its first ones)


@dataclass
class SinkStack(FaultStack):
    expected: np.ndarray | None = None  # [SAMPLE, 384]: sentence-transformers' vectors of the first SAMPLE texts

    def reindex(self, job: str, sink: str, *more: str, docs: Path | None = None) -> subprocess.Popen:
        return self.reindex_to(job, "--sink", sink, "--stall-timeout", "120", *more, docs=docs)

    def finished(self, job: str, proc: subprocess.Popen) -> str:
        try:
            rc = proc.wait(600)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"job {job} did not finish\n{proc.stdout.read()}\n{self.logs()}") from None
        output = proc.stdout.read()
        assert rc == 0, output + self.logs()
        return output


def _fields(i: int) -> dict:
    return {"lang": "en" if i % 3 else "de", "n": i}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, reference) -> Iterator[SinkStack]:
    folder = tmp_path_factory.mktemp("sinks")
    server = EmbeddedNats(folder / "nats")
    server.start()
    texts = mixed_texts(DOCUMENTS)
    docs = folder / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": t, **_fields(i)}) + "\n" for i, t in enumerate(texts)))
    built = SinkStack(server, folder, docs, texts, expected=reference.encode(texts[:SAMPLE]))
    try:
        for name in ("tokenizer", "worker-1", "worker-2"):
            built.start(name)
        with running(built.services, server.url, timeout=120):
            yield built
    finally:
        server.stop()


def _pg_ctl(server: pgserver.PostgresServer, action: str) -> None:
    """Stop or start the server on its data folder (and socket folder), as an operator would."""
    from pgserver._commands import pg_ctl

    if action == "stop":
        stop_postgres(server)
    else:
        socket_dir = server.get_uri().rpartition("host=")[2]
        pg_ctl(
            ["-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(server.log), "start"],
            pgdata=server.pgdata,
            user=server.system_user,
            timeout=30,
        )


def _pg_rows(uri: str, table: str, chunked: bool = False) -> list[tuple]:
    import psycopg
    from pgvector.psycopg import register_vector

    with psycopg.connect(uri) as conn:
        register_vector(conn)
        chunk = ", chunk, start_char, end_char, text" if chunked else ""
        rows = conn.execute(f"SELECT id, embedding, metadata{chunk} FROM {table}").fetchall()
    return [
        (r[0], np.asarray(r[1].to_numpy() if hasattr(r[1], "to_numpy") else r[1], np.float32), *r[2:]) for r in rows
    ]


def _store(kind: str, stack: SinkStack, postgres_uri: str, job: str) -> tuple[str, callable]:
    """(the sink URL of a fresh table, a reader of its rows: [(id, vector, metadata)])."""
    if kind == "pgvector":
        return f"{postgres_uri}&table={job}", lambda: [(i, np.asarray(v), m) for i, v, m in _pg_rows(postgres_uri, job)]
    if kind == "lancedb":
        path = stack.folder / "lance"

        def lance() -> list[tuple]:
            import lancedb

            rows = lancedb.connect(str(path)).open_table(job).to_arrow().to_pylist()
            return [(r["id"], np.asarray(r["vector"]), json.loads(r["metadata"])) for r in rows]

        return f"lancedb://{path}?table={job}", lance
    path = stack.folder / "qdrant"

    def qdrant() -> list[tuple]:
        from qdrant_client import QdrantClient

        client = QdrantClient(path=str(path))
        try:
            points = client.scroll(job, limit=10 * DOCUMENTS, with_payload=True, with_vectors=True)[0]
        finally:
            client.close()
        return [(p.payload["id"], np.asarray(p.vector["dense"]), p.payload["metadata"]) for p in points]

    return f"qdrant://{path}?collection={job}", qdrant


def _wait_mid_job(stack: SinkStack, job: str, proc: subprocess.Popen, total: int = DOCUMENTS) -> int:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        done = _state(stack.nats.url, job).get("done", 0)
        if done >= 4 * BATCH:
            assert done < total, "the job ended before the fault: make it longer"
            return done
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    raise TimeoutError(f"job {job} made no progress\n{stack.logs()}")


def _check_rows(stack: SinkStack, rows: list[tuple]) -> None:
    """Every id once, its fields as metadata, the sample's vectors the reference's."""
    ids = [r[0] for r in rows]
    assert len(ids) == DOCUMENTS and set(ids) == {f"d{i}" for i in range(DOCUMENTS)}
    by_id = {r[0]: r for r in rows}
    assert all(by_id[f"d{i}"][2] == _fields(i) for i in range(DOCUMENTS))
    got = np.stack([by_id[f"d{i}"][1] for i in range(SAMPLE)])
    assert cosines(got, stack.expected).min() >= COSINE_TOLERANCE


@pytest.mark.parametrize("kind", ["pgvector", "lancedb", "qdrant"])
def test_a_worker_killed_mid_job_leaves_every_id_once_in_the_store(stack, postgres_uri, kind):
    job = f"sink_{kind}"
    url, read = _store(kind, stack, postgres_uri, job)
    proc = stack.reindex(job, url)
    done = _wait_mid_job(stack, job, proc)
    stack.services["worker-1"].kill()  # SIGKILL: the batches it held are never acknowledged
    wait_until(
        lambda: _state(stack.nats.url, job).get("done", 0) > done,
        120,
        "the job going on with one worker",
        [stack.services["worker-2"]],
    )
    stack.start("worker-1")
    output = stack.finished(job, proc)
    assert f"({DOCUMENTS} rows)" in output, output
    _check_rows(stack, read())
    stored = _stored_ids(stack.nats.url, job)
    assert len(stored) == DOCUMENTS and set(stored.values()) == {1}
    state = _state(stack.nats.url, job)
    assert state["status"] == "done" and state["sink_rows"] == DOCUMENTS and "sink_error" not in state, state


def test_a_chunked_job_is_keyed_by_id_and_chunk(stack, postgres_uri, reference):
    job = "sink_chunks"
    docs = stack.folder / "chunked.jsonl"
    docs.write_text("".join(stack.docs.read_text().splitlines(keepends=True)[:CHUNKED]))
    proc = stack.reindex(
        job, f"{postgres_uri}&table={job}", "--chunk-size", "96", "--chunk-overlap", "8", "--with-text", docs=docs
    )
    stack.finished(job, proc)
    rows = _pg_rows(postgres_uri, job, chunked=True)
    keys = [(r[0], r[3]) for r in rows]
    state = _state(stack.nats.url, job)
    assert len(set(keys)) == len(keys) == state["chunks_done"] > CHUNKED, state
    chunks_of: dict[str, set[int]] = {}
    for doc_id, chunk in keys:
        chunks_of.setdefault(doc_id, set()).add(chunk)
    assert len(chunks_of) == CHUNKED and all(c == set(range(len(c))) for c in chunks_of.values())
    sample = sorted(rows, key=lambda r: (int(r[0][1:]), r[3]))[:SAMPLE]
    pieces = [stack.texts[int(r[0][1:])][r[4] : r[5]] for r in sample]
    assert [r[6] for r in sample] == pieces  # --with-text: each chunk's own text
    assert all(r[2] == _fields(int(r[0][1:])) for r in sample)
    got = np.stack([np.asarray(r[1]) for r in sample])
    assert cosines(got, reference.encode(pieces)).min() >= COSINE_TOLERANCE


def test_postgres_stopped_mid_job_pauses_the_job_until_it_is_back(stack, tmp_path_factory):
    server = pgserver.get_server(tmp_path_factory.mktemp("pg-down"), cleanup_mode="stop")
    uri, job = server.get_uri(), "sink_pg_down"
    docs = stack.folder / "paused.jsonl"
    docs.write_text("".join(stack.docs.read_text().splitlines(keepends=True)[:PAUSED]))
    try:
        proc = stack.reindex(job, f"{uri}&table={job}", docs=docs)
        _wait_mid_job(stack, job, proc, PAUSED)
        _pg_ctl(server, "stop")
        wait_until(lambda: "sink_error" in _state(stack.nats.url, job), 120, "the job state saying the store is down")
        error = _state(stack.nats.url, job)["sink_error"]
        assert error["since"] <= time.time() and "PostgreSQL at postgresql://postgres@" in error["message"], error
        listed = subprocess.run(
            [sys.executable, "-m", "embedfleet.services.cli", "jobs", "--nats", stack.nats.url],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        assert "waiting for the store since" in listed, listed
        time.sleep(2.0)  # the job goes on meanwhile: its results wait in the results stream
        _pg_ctl(server, "start")
        output = stack.finished(job, proc)
        assert "waiting for the store" in output and "takes rows again" in output, output
        rows = _pg_rows(uri, job)
        assert sorted(r[0] for r in rows) == sorted(f"d{i}" for i in range(PAUSED))
        state = _state(stack.nats.url, job)
        assert "sink_error" not in state and state["sink_rows"] == PAUSED, state
    finally:
        _pg_ctl(server, "stop")


def test_a_sink_that_cannot_take_the_job_ends_reindex_before_anything_is_published(stack, postgres_uri):
    from embedfleet.shared.sinks.base import Shape
    from embedfleet.shared.sinks.pgvector import PgVectorSink

    bad = stack.reindex("sink_bad_url", "mysql://user:s3cret@db/x")
    output = bad.communicate(timeout=120)[0]
    assert bad.returncode == 2 and "unknown sink 'mysql://'" in output and "s3cret" not in output, output
    narrow = PgVectorSink(f"{postgres_uri}&table=narrow")
    narrow.open(Shape("float32", "dense", 16))  # a table made by another model
    narrow.close()
    other = stack.reindex("sink_narrow", f"{postgres_uri}&table=narrow")
    output = other.communicate(timeout=120)[0]
    assert other.returncode == 2, output
    assert "holds embedding vector(16); this job makes vector(384)" in output and "nothing was published" in output
    for job in ("sink_bad_url", "sink_narrow"):
        assert _state(stack.nats.url, job) == {} and not _stored_ids(stack.nats.url, job)
