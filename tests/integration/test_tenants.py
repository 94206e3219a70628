"""Tenants in the vector stores and per-key token budgets for jobs, on real processes: a tiny BERT served
by a tokenizer and a worker, a real PostgreSQL with pgvector (pgserver) and LanceDB on disk, and a
gateway with API keys, an operator key, --key-tables-file and --key-tokens-per-minute.

The attacks, each refused in OpenAI's error shape with nothing changed: key B upserting into the table
key A searches (A's rows as before), B searching A's table, B taking one of A's table names first (no
table made; A writes and searches it after), a table named ``pg_authid`` (refused before anything is
made), a store not allowed (its refusal names none of the gateway's stores), and jobs far past their
key's token budget (refused at submission, nothing published), and reranks charged to it too. And what is allowed: A's own tables,
the operator's every table, top_k up to the documented 1000 on pgvector."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pgserver
import psycopg
import pytest

from embedfleet.services.gateway.metrics import key_id
from embedfleet.shared.nats.server import free_port
from embedfleet.shared.sinks import Rows, Shape, sink_for
from tests.support import tiny_models
from tests.support.procs import Service, healthy, start_fleet, stop_all, wait_until
from tests.support.prometheus_text import value

pytestmark = pytest.mark.integration

PREFIX = "tenants"
MODEL = "tiny-bert"
KEY_A, KEY_B, KEY_OP, KEY_L, KEY_R = "key-of-a", "key-of-b", "key-of-operator", "key-of-limited", "key-of-r"
RERANKER = "tiny-reranker"
SECRET = "tenants-key-ids"  # the keys' ids in metrics (services/gateway/metrics.py)
TOKENS_PER_MINUTE = 1000
A_TEXTS = [f"document {i} of tenant a, about the rivers of the north" for i in range(20)]


@dataclass
class Tenants:
    base: str  # the gateway with keys, tables and token budgets
    pg: str  # the PostgreSQL URL the gateway writes into (--job-sinks) and searches (--search-sink)
    lance: Path  # the LanceDB folder it writes into too
    dim: int  # the tiny model's dimension
    services: list[Service]

    def post(self, path: str, key: str, body: dict) -> httpx.Response:
        return httpx.post(f"{self.base}{path}", json=body, headers={"authorization": f"Bearer {key}"}, timeout=60)

    def job(self, key: str, body: dict) -> httpx.Response:
        return self.post("/v1/jobs", key, body)

    def search(self, key: str, **body) -> httpx.Response:
        return self.post("/v1/search", key, {"query": "rivers of the north", **body})

    def finished(self, key: str, job: str, timeout: float = 120, sink: bool = True) -> dict:
        seen: dict = {}

        def over() -> bool:
            r = httpx.get(f"{self.base}/v1/jobs/{job}", headers={"authorization": f"Bearer {key}"}, timeout=10)
            seen.update(r.json())
            return r.status_code == 200 and seen["status"] == "done" and (bool(seen.get("sink_done")) or not sink)

        wait_until(over, timeout, f"job {job}", self.services)
        return seen

    def rows(self, table: str) -> list[tuple]:
        with psycopg.connect(self.pg.split("&table=")[0]) as conn:
            return conn.execute(f'SELECT id, text, embedding::text FROM "{table}" ORDER BY id').fetchall()

    def exists(self, table: str, schema: str = "public") -> bool:
        with psycopg.connect(self.pg.split("&table=")[0]) as conn:
            return conn.execute("SELECT to_regclass(%s)", (f"{schema}.{table}",)).fetchone()[0] is not None


def _url(tenants: Tenants, table: str) -> str:
    """The pgvector store as a client names it: no password (it has none), its table."""
    return f"{tenants.pg.split('&table=')[0]}&table={table}"


def _error(r: httpx.Response, status: int, param: str | None, starts: str) -> str:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error
    assert error["message"].startswith(starts), error["message"]
    return error["message"]


def _forbidden(r: httpx.Response, param: str) -> str:
    message = _error(r, 403, param, "this API key may not use table")
    assert r.json()["error"]["type"] == "permission_error" and r.json()["error"]["code"] == "forbidden"
    return message


@pytest.fixture(scope="module")
def tenants(nats_url, tmp_path_factory) -> Iterator[Tenants]:
    root = tmp_path_factory.mktemp("tenants")
    server = pgserver.get_server(root / "pg", cleanup_mode="stop")
    pg = f"{server.get_uri()}&table=a_docs"
    folder = tiny_models.build("bert", root / "model")
    logs = root / "logs"
    logs.mkdir()
    (root / "keys").write_text(
        f"# KEY TABLE[,TABLE...]\n{KEY_A} a_*\n{KEY_B}\tb_docs, b_faq\n{KEY_L} l_docs\n", encoding="utf-8"
    )
    reranker = tiny_models.build("bert", root / "reranker", classifier=True, num_labels=1)
    scorer = Service(
        "scorer",
        ["--nats", nats_url, "--subject-prefix", PREFIX, "--model", str(reranker), "--model-name", RERANKER],
        logs,
    )
    _, services = start_fleet(nats_url, PREFIX, {MODEL: folder, RERANKER: reranker}, logs, named=True, extra=[scorer])
    port = free_port()
    gateway = Service(
        "gateway",
        [
            *("--nats", nats_url, "--subject-prefix", PREFIX, "--port", str(port)),
            *("--api-keys", f"{KEY_A},{KEY_B},{KEY_L},{KEY_R}", "--operator-keys", KEY_OP),
            *("--key-tables-file", str(root / "keys"), "--key-tokens-per-minute", str(TOKENS_PER_MINUTE)),
            *("--job-sinks", f"{server.get_uri()},lancedb://{root / 'lance'}", "--search-model", MODEL),
            *("--default-model", MODEL),  # jobs name none: the embedder, whichever model registers first
        ],
        logs,
        {"EMBEDFLEET_SEARCH_SINK": pg, "EMBEDFLEET_KEY_ID_SECRET": SECRET},
    )
    services.append(gateway)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthy(base), 120, "the tenants' gateway", services)
        models = httpx.get(f"{base}/v1/models", headers={"authorization": f"Bearer {KEY_A}"}, timeout=10)
        built = Tenants(base, pg, root / "lance", 0, services)
        # A's table, by A's own job through the fleet: the rows A searches
        docs = [{"id": f"a{i}", "text": t, "n": i} for i, t in enumerate(A_TEXTS)]
        r = built.job(KEY_A, {"documents": docs, "sink": _url(built, "a_docs"), "with_text": True, "id": "a-load"})
        assert r.status_code == 202, (r.text, models.text)
        built.finished(KEY_A, "a-load")
        built.dim = int(built.rows("a_docs")[0][2].count(",")) + 1
        yield built
    finally:
        stop_all(services)
        server.cleanup()


def test_a_key_cannot_upsert_into_the_table_another_key_searches(tenants):
    before = tenants.rows("a_docs")
    planted = [{"id": "a0", "text": "PLANTED by b"}, {"id": "b-new", "text": "PLANTED by b"}]
    for sink in (_url(tenants, "a_docs"), f"lancedb://{tenants.lance}?table=a_docs"):
        message = _forbidden(tenants.job(KEY_B, {"documents": planted, "sink": sink, "with_text": True}), "sink")
        assert message == "this API key may not use table 'a_docs'; its tables: b_docs, b_faq", message
    assert tenants.rows("a_docs") == before and len(before) == len(A_TEXTS)
    assert not (tenants.lance / "a_docs.lance").exists()
    hits = tenants.search(KEY_A, top_k=50).json()["data"]
    assert sorted(h["text"] for h in hits) == sorted(A_TEXTS)  # nothing planted among A's hits


def test_a_key_cannot_search_another_key_s_table(tenants):
    _forbidden(tenants.search(KEY_B), "table")  # the --search-sink's own table is A's
    _forbidden(tenants.search(KEY_B, table="a_docs"), "table")
    _forbidden(tenants.search(KEY_L, table="a_other"), "table")
    mine = tenants.search(KEY_A, table="a_docs", top_k=3)
    assert mine.status_code == 200 and len(mine.json()["data"]) == 3, mine.text
    # the key's own table, not loaded: not found (nothing made)
    _error(tenants.search(KEY_B, table="b_docs"), 404, "table", "no table to search")
    assert not tenants.exists("b_docs")


def test_a_key_cannot_take_another_key_s_table_name_first(tenants):
    """B asks first for a name of A's (of another dimension even): refused, no table made; A's job then
    makes it and writes it, and A searches it."""
    body = {"documents": [{"id": "x", "text": "squatting"}], "sink": _url(tenants, "a_later"), "id": "b-squat"}
    _forbidden(tenants.job(KEY_B, body), "sink")
    _forbidden(tenants.job(KEY_B, {**body, "embedding_type": "binary"}), "sink")
    assert not tenants.exists("a_later")
    assert httpx.get(f"{tenants.base}/v1/jobs/b-squat", headers={"authorization": f"Bearer {KEY_B}"}).status_code == 404
    docs = [{"id": f"l{i}", "text": t} for i, t in enumerate(A_TEXTS[:5])]
    r = tenants.job(KEY_A, {"documents": docs, "sink": _url(tenants, "a_later"), "with_text": True, "id": "a-later"})
    assert r.status_code == 202, r.text
    tenants.finished(KEY_A, "a-later")
    hits = tenants.search(KEY_A, table="a_later").json()["data"]
    assert sorted(h["id"] for h in hits) == [f"l{i}" for i in range(5)]


def test_operator_keys_use_every_table(tenants):
    for table in (None, "a_docs", "a_later"):
        r = tenants.search(KEY_OP, **({"table": table} if table else {}), top_k=2)
        assert r.status_code == 200 and len(r.json()["data"]) == 2, r.text


def test_a_table_named_pg_authid_is_refused_before_anything_is_made(tenants):
    for key in (KEY_OP, KEY_A):  # the operator's key may use every table, but for this name
        body = {"documents": [{"id": "x", "text": "t"}], "sink": _url(tenants, "pg_authid")}
        _error(tenants.job(key, body), 400, "sink", "table='pg_authid': names beginning with pg_ are PostgreSQL's own")
    _error(tenants.search(KEY_OP, table="pg_authid"), 400, "table", "table='pg_authid': names beginning")
    assert not tenants.exists("pg_authid")


def test_a_store_not_allowed_is_refused_naming_none_of_the_gateway_s(tenants):
    where = tenants.pg.split("host=")[1].split("&")[0]  # the socket folder: a path of the server's
    for sink in ("postgresql://admin@db.example:5432/x?table=b_docs", "qdrant://localhost:6333?collection=b_docs"):
        message = _error(
            tenants.job(KEY_B, {"documents": [{"id": "x", "text": "t"}], "sink": sink}),
            400,
            "sink",
            "'sink' names a",
        )
        assert where not in message and str(tenants.lance) not in message and "postgres@" not in message, message


def test_top_k_up_to_1000_on_pgvector(tenants):
    """1,100 rows behind an HNSW index: top_k 1000 answers 1000 rows (pgvector's ef_search tops at 1000)."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((1100, tenants.dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    sink = sink_for(_url(tenants, "a_many"))
    sink.open(Shape("float32", "dense", tenants.dim))
    sink.write(Rows([f"m{i}" for i in range(1100)], vectors, texts=[f"row {i}" for i in range(1100)]))
    sink.finish()  # the HNSW index
    sink.close()
    for top_k in (501, 1000):
        r = tenants.search(KEY_A, table="a_many", top_k=top_k)
        assert r.status_code == 200, r.text
        assert len({h["id"] for h in r.json()["data"]}) == top_k


def test_jobs_count_against_the_key_s_token_budget(tenants):
    """The issue's case: three 200-document jobs from a key limited by minute; each refused (413) from its
    estimate, nothing published. A job within the budget runs; the next, which the budget does not hold
    now, is refused with 429 and Retry-After."""
    text = "a sentence of some eighty characters, as a document of a bulk job would hold it."
    big = [{"id": f"d{i}", "text": text} for i in range(200)]
    for n in range(3):
        message = _error(
            tenants.job(KEY_L, {"documents": big, "id": f"big-{n}"}), 413, "documents", "this job's 200 documents"
        )
        assert f"limit of {TOKENS_PER_MINUTE} tokens a minute" in message
        assert (
            httpx.get(f"{tenants.base}/v1/jobs/big-{n}", headers={"authorization": f"Bearer {KEY_L}"}).status_code
            == 404
        )
    fits = [{"id": f"f{i}", "text": text} for i in range(35)]  # some 770 tokens estimated: within a minute's
    started = time.monotonic()
    assert tenants.job(KEY_L, {"documents": fits, "id": "fits"}).status_code == 202
    again = tenants.job(KEY_L, {"documents": fits, "id": "fits-again"})
    _error(again, 429, "documents", "this job makes some")
    wait = int(again.headers["retry-after"])
    assert 1 <= wait <= 60 - (time.monotonic() - started) + 1, wait
    # the job's tokens, as the tokenizers counted them, in the key's usage (the key made no other request)
    done = tenants.finished(KEY_L, "fits", sink=False)
    assert done["tokens"] > 0
    label = key_id(KEY_L, SECRET.encode())

    def used() -> float:
        try:
            return value(httpx.get(f"{tenants.base}/metrics").text, "embedfleet_key_tokens_total", key=label)
        except AssertionError:  # no sample yet
            return 0.0

    wait_until(
        lambda: used() == done["tokens"],
        30,
        "the job's tokens in the key's usage",
        tenants.services,
    )


def test_reranks_count_against_the_key_s_token_budget(tenants):
    """The scorer counts no tokens: a rerank is charged its pairs' estimate, so a key past its budget by
    reranking waits as one past it by embedding does."""
    wait_until(
        lambda: tenants.post("/v1/rerank", KEY_R, {"model": RERANKER, "query": "q", "documents": ["d"]}).is_success,
        60,
        "the scorer",
        tenants.services,
    )
    texts = ["a long passage about the rivers of the north and the towns along their banks " * 5] * 20
    r = tenants.post("/v1/rerank", KEY_R, {"model": RERANKER, "query": "rivers", "documents": texts})
    assert r.status_code == 200, r.text
    limited = tenants.post("/v1/rerank", KEY_R, {"model": RERANKER, "query": "rivers", "documents": ["d"]})
    _error(limited, 429, None, f"this API key is over its limit of {TOKENS_PER_MINUTE} tokens a minute")
    assert int(limited.headers["retry-after"]) >= 1
