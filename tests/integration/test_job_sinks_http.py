"""POST /v1/jobs with "sink": the gateway writes a job's rows into a store, on real processes, a real
PostgreSQL with pgvector (pgserver) and LanceDB on disk, the real model. Every id lands once with the
sentence-transformers vector, its input's other fields and its text; the job is done only once they
are in the store; a gateway SIGKILLed mid-job is replaced by another that takes the writing over and
loses nothing; stores not allowed, URLs with a password and tables of another dimension are refused
in OpenAI's error shape before anything is published."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from embedfleet.services.gateway.jobs.answers import JobSubmitted
from embedfleet.shared.nats.server import EmbeddedNats, free_port
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.integration.test_job_faults import _state, _stored_ids
from tests.integration.test_job_sinks import _pg_rows
from tests.support.corpus import mixed_texts
from tests.support.procs import Service, healthy, job_finished, running, wait_until

pytestmark = pytest.mark.integration

DOCUMENTS = 600  # the file job's, long enough to kill its gateway in the middle
INLINE = 40
SAMPLE = 120  # documents whose vectors are compared with the reference


def _fields(i: int) -> dict:
    return {"lang": "en" if i % 3 else "de", "n": i}


class Fleet:
    def __init__(self, folder, nats: EmbeddedNats, pg_uri: str) -> None:
        self.folder, self.nats, self.pg_uri = folder, nats, pg_uri
        self.services: dict[str, Service] = {}
        self.base = ""

    def gateway(self) -> None:
        port = free_port()
        self.services["gateway"] = Service(
            "gateway",
            [
                "--nats",
                self.nats.url,
                "--port",
                str(port),
                "--jobs-dir",
                str(self.folder),
                "--request-timeout",
                "120",
                "--job-sinks",
                f"{self.pg_uri},lancedb://{self.folder / 'lance'}",
            ],
            self.folder,
        )
        self.base = f"http://127.0.0.1:{port}"
        wait_until(lambda: healthy(self.base), 120, "the gateway", [self.services["gateway"]])

    def post(self, body: dict) -> httpx.Response:
        return httpx.post(f"{self.base}/v1/jobs", json=body, timeout=120)

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{s.log()[-3000:]}" for n, s in self.services.items())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, postgres_uri) -> Iterator[Fleet]:
    folder = tmp_path_factory.mktemp("http-sinks")
    server = EmbeddedNats(folder / "nats")
    server.start()
    built = Fleet(folder, server, postgres_uri)
    common = ["--nats", server.url, "--ack-wait", "4"]
    try:
        built.services["tokenizer"] = Service("tokenizer", [*common, "--chunk-seqs", "16", "--bulk-ahead", "4"], folder)
        for name in ("worker-1", "worker-2"):
            built.services[name] = Service(
                "worker", [*common, "--max-batch-tokens", "2048"], folder, {"OMP_NUM_THREADS": "1"}
            )
        with running(built.services, server.url, timeout=120):
            built.gateway()
            yield built
    finally:
        server.stop()


def _sink(fleet: Fleet, table: str) -> str:
    return f"{fleet.pg_uri}&table={table}"


def test_an_inline_job_lands_in_the_store_with_its_fields_and_texts(fleet, reference):
    texts = mixed_texts(INLINE)
    documents = [{"id": f"i{i}", "text": t, **_fields(i)} for i, t in enumerate(texts)]
    answer = fleet.post(
        {"documents": documents, "sink": _sink(fleet, "inline_job"), "with_text": True, "id": "inline_job"}
    )
    assert answer.status_code == 202, answer.text
    JobSubmitted.model_validate_json(answer.content)  # the answer is its documented model, strictly
    assert answer.json()["sink"].endswith("table=inline_job"), answer.json()
    state = job_finished(fleet.base, "inline_job", 180)
    assert state["status"] == "done" and state["sink_rows"] == INLINE and state.get("sink_done"), state
    assert "sink_lease" not in state  # the writer's own bookkeeping is not shown
    rows = {r[0]: r for r in _pg_rows(fleet.pg_uri, "inline_job")}
    assert sorted(rows) == sorted(d["id"] for d in documents)
    assert all(rows[f"i{i}"][2] == _fields(i) for i in range(INLINE))
    got = np.stack([rows[f"i{i}"][1] for i in range(INLINE)])
    assert cosines(got, reference.encode(texts)).min() >= COSINE_TOLERANCE
    import psycopg

    with psycopg.connect(fleet.pg_uri) as conn:
        stored = dict(conn.execute("SELECT id, text FROM inline_job").fetchall())
    assert stored == {f"i{i}": t for i, t in enumerate(texts)}


def test_a_chunked_job_goes_to_lancedb_keyed_by_id_and_chunk(fleet, reference):
    import lancedb

    texts = mixed_texts(12)
    documents = [{"id": f"c{i}", "text": t} for i, t in enumerate(texts)]
    sink = f"lancedb://{fleet.folder / 'lance'}?table=chunked"
    answer = fleet.post(
        {
            "documents": documents,
            "sink": sink,
            "chunking": {"size": 64, "overlap": 8},
            "with_text": True,
            "id": "chunked_job",
        }
    )
    assert answer.status_code == 202, answer.text
    state = job_finished(fleet.base, "chunked_job", 180)
    assert state["status"] == "done" and state["sink_rows"] == state["chunks_done"], state
    rows = lancedb.connect(str(fleet.folder / "lance")).open_table("chunked").to_arrow().to_pylist()
    keys = [(r["id"], r["chunk"]) for r in rows]
    assert len(keys) == len(set(keys)) == state["chunks_done"] > len(texts)
    pieces = [texts[int(r["id"][1:])][r["start_char"] : r["end_char"]] for r in rows]
    assert [r["text"] for r in rows] == pieces
    got = np.stack([np.asarray(r["vector"], np.float32) for r in rows])
    assert cosines(got, reference.encode(pieces)).min() >= COSINE_TOLERANCE


def test_a_gateway_killed_mid_job_is_replaced_and_nothing_is_lost(fleet, reference):
    """A file job; its gateway SIGKILLed once some rows are in the store; a new gateway takes the
    writing over once the dead one's lease runs out, reading the rows' fields and texts back."""
    texts = mixed_texts(DOCUMENTS)
    (fleet.folder / "big.jsonl").write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t, **_fields(i)}) + "\n" for i, t in enumerate(texts))
    )
    job = "taken_over"
    answer = fleet.post(
        {"path": "big.jsonl", "sink": _sink(fleet, job), "with_text": True, "id": job, "batch_size": 16}
    )
    assert answer.status_code == 202, answer.text
    deadline = time.monotonic() + 180
    while (_state(fleet.nats.url, job).get("sink_rows") or 0) == 0:
        assert time.monotonic() < deadline, fleet.logs()
        time.sleep(0.05)
    assert _state(fleet.nats.url, job).get("done", 0) < DOCUMENTS, "the job ended before the fault: make it longer"
    fleet.services["gateway"].kill()
    fleet.gateway()
    state = job_finished(fleet.base, job, 240)
    assert state["status"] == "done" and state["sink_rows"] == DOCUMENTS and state.get("sink_done"), state
    rows = _pg_rows(fleet.pg_uri, job)
    assert len(rows) == DOCUMENTS and {r[0] for r in rows} == {f"d{i}" for i in range(DOCUMENTS)}
    by_id = {r[0]: r for r in rows}
    assert all(by_id[f"d{i}"][2] == _fields(i) for i in range(DOCUMENTS))
    got = np.stack([by_id[f"d{i}"][1] for i in range(SAMPLE)])
    assert cosines(got, reference.encode(texts[:SAMPLE])).min() >= COSINE_TOLERANCE
    import psycopg

    with psycopg.connect(fleet.pg_uri) as conn:
        assert conn.execute(f"SELECT count(*) FROM {job} WHERE text IS NULL").fetchone()[0] == 0
    assert "taken over" in fleet.services["gateway"].log()
    assert set(_stored_ids(fleet.nats.url, job).values()) == {1}


@pytest.mark.parametrize(
    "sink, message",
    [
        ("postgresql://postgres@elsewhere:5432/postgres?table=t", "does not write into"),
        ("postgresql://postgres:hunter2@/postgres?table=t", "no password"),
        ("redis://localhost/0", "does not write into"),
        (7, "'sink' must be a string, got 7"),
        ("", "'sink' must not be an empty string"),
    ],
)
def test_stores_not_allowed_are_refused_before_anything_is_published(fleet, sink, message):
    answer = fleet.post({"documents": [{"id": "a", "text": "x"}], "sink": sink, "id": "refused"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert message in error["message"] and error["param"] == "sink", error
    assert "hunter2" not in answer.text
    assert _state(fleet.nats.url, "refused") == {}


def test_a_table_of_another_dimension_is_refused_with_the_stores_message(fleet):
    import psycopg

    with psycopg.connect(fleet.pg_uri, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute("CREATE TABLE narrow (id text primary key, embedding vector(3), metadata jsonb, text text)")
    answer = fleet.post({"documents": [{"id": "a", "text": "x"}], "sink": _sink(fleet, "narrow"), "id": "narrow"})
    assert answer.status_code == 400, answer.text
    assert "3" in answer.json()["error"]["message"] and "nothing was published" in answer.json()["error"]["message"]
    assert _state(fleet.nats.url, "narrow") == {}


def test_the_docs_example_runs_as_typed(fleet):
    """docs/bulk-jobs.md's curl, its store swapped for the test's PostgreSQL (its table kept), as the Search
    example's host is: the two documents land with their fields and texts."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "bulk-jobs.md").read_text()
    (command,) = re.findall(r"^  (curl -s localhost:8080/v1/jobs .*)$", page, re.M)
    assert "postgresql://loader@db:5432/docs?table=articles" in command
    command = command.replace("localhost:8080", fleet.base.removeprefix("http://")).replace(
        "postgresql://loader@db:5432/docs?", f"{fleet.pg_uri}&"
    )
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)["id"]
    assert job_finished(fleet.base, job, 120)["sink_rows"] == 2
    import psycopg

    with psycopg.connect(fleet.pg_uri) as conn:
        rows = conn.execute("SELECT id, metadata, text FROM articles ORDER BY id").fetchall()
    assert rows == [
        ("a1", {"lang": "en"}, "Rivers carry sediment to the sea."),
        ("a2", {"lang": "en"}, "Glaciers carve valleys."),
    ]
