"""POST /v1/search on real processes over real stores: 300 corpus texts embedded by sentence-transformers
(the reference) and loaded, with their texts and metadata, through the sinks' own ``write`` into a
pgvector table (PostgreSQL by pgserver) and a Qdrant local-mode folder; a fleet serving all-MiniLM-L6-v2
and a cross-encoder (tiny random BERT, with its scorer), and gateways started with --search-sink.

Checked: recall@10 against exact search (numpy cosine over the same vectors), scores against the
reference, filters, reranking equal to POST /v1/rerank on the same candidates' texts, /v1/models, the
README's example as typed, every field at its extremes, and the errors in OpenAI's shape (no store,
bad fields, unknown or unfit models, the store down and back), the store's password never shown."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pgserver
import pytest

from embedfleet.services.gateway.search.answers import SearchAnswer
from embedfleet.shared.nats.server import free_port
from embedfleet.shared.sinks import Rows, Shape, sink_for
from tests.integration.test_field_extremes import EXTREMES, _failure
from tests.support import tiny_models
from tests.support.corpus import mixed_texts
from tests.support.procs import Service, healthy, running_fleet, stop_all, wait_until

pytestmark = pytest.mark.integration

MODEL, RERANKER, PREFIX = "all-MiniLM-L6-v2", "tiny-reranker", "search"
PASSWORD = "s3cret-pw"  # in the store's URL; the socket pgserver listens on trusts, so it is never checked
SCORE_TOLERANCE = 1e-3  # a hit's score against the reference query's cosine with the stored vector
QUERIES = [
    "how do I read a file line by line",
    "what does the with statement do",
    "define a class with methods",
    "catch an exception and raise another",
    "format a string with named fields",
    "sort a list of tuples by key",
    "difference between a list and a tuple",
    "how are default arguments evaluated",
    "call a function with keyword arguments",
    "iterate over a dictionary's items",
    "what is a generator expression",
    "import a module from a package",
    "global and nonlocal variables",
    "comparison of objects of different types",
    "how does slicing work on sequences",
    "what is the ellipsis literal",
    "boolean operations and short circuit",
    "operator precedence in expressions",
    "lambda expressions and anonymous functions",
    "what does the yield statement return",
    "assert statement and optimization",
    "the del statement removes names",
    "how do decorators wrap a function",
    "what are special method names",
    "integer division and the modulo operator",
    "unicode strings and bytes literals",
    "the pass statement does nothing",
    "how does the for loop use an iterator",
    "coroutines with async and await",
    "what is name binding and scope",
]


@dataclass
class Corpus:
    texts: list[str]
    vectors: np.ndarray  # [n, 384] float32, unit length (the reference's)
    metadata: list[dict]

    @property
    def ids(self) -> list[str]:
        return [f"doc-{i}" for i in range(len(self.texts))]

    def exact(self, query: np.ndarray, k: int, where: dict | None = None) -> list[str]:
        """The ``k`` ids closest to ``query`` by cosine, among the rows whose metadata has ``where``'s values."""
        keep = np.array([all(m.get(f) == v for f, v in (where or {}).items()) for m in self.metadata])
        scores = np.where(keep, self.vectors @ query, -np.inf)
        return [self.ids[i] for i in np.argsort(-scores, kind="stable")[: min(k, int(keep.sum()))]]


@dataclass
class Fleet:
    plain: str  # a gateway without a store
    pg: str  # --search-sink: the pgvector table, --search-model pinned
    qdrant: str  # --search-sink: the Qdrant folder; the request names the model
    pg_url: str
    pg_folder: Path
    services: dict[str, Service]


def _kind(text: str) -> str:
    return "query" if len(text) < 80 else "document" if len(text) > 1500 else "passage"


@pytest.fixture(scope="module")
def corpus(reference) -> Corpus:
    texts = list(dict.fromkeys(mixed_texts(340)))[:300]
    assert len(texts) == 300
    vectors = reference.encode(texts, normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)
    metadata = [{"n": i, "kind": _kind(t), "even": i % 2 == 0} for i, t in enumerate(texts)]
    return Corpus(texts, vectors, metadata)


def _load(url: str, corpus: Corpus) -> None:
    """The corpus written as a re-index job writes it: batches through the sink's own ``write``."""
    sink = sink_for(url)
    sink.open(Shape("float32", "dense", corpus.vectors.shape[1]))
    for start in range(0, len(corpus.texts), 128):
        part = slice(start, start + 128)
        sink.write(Rows(corpus.ids[part], corpus.vectors[part], corpus.metadata[part], texts=corpus.texts[part]))
    sink.finish()
    assert sink.count() == len(corpus.texts)
    sink.close()  # Qdrant's local mode: one process a folder, and the gateway's is next


@pytest.fixture(scope="module")
def fleet(corpus, nats_url, model_info, tmp_path_factory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("search")
    pg_folder = root / "pg"
    server = pgserver.get_server(pg_folder, cleanup_mode="stop")
    pg_url = server.get_uri().replace("postgres:@", f"postgres:{PASSWORD}@") + "&table=docs"
    assert PASSWORD in pg_url
    _load(pg_url, corpus)
    qdrant_url = f"qdrant://{root}/qdrant?collection=docs"
    _load(qdrant_url, corpus)

    reranker = tiny_models.build("bert", root / "reranker", classifier=True, num_labels=1)
    logs = root / "logs"
    logs.mkdir()
    common = ["--nats", nats_url, "--subject-prefix", PREFIX]
    scorer = Service("scorer", [*common, "--model", str(reranker), "--model-name", RERANKER], logs)
    with running_fleet(
        nats_url, PREFIX, {MODEL: model_info.path, RERANKER: reranker}, logs, named=True, extra=[scorer]
    ) as (plain, started):
        ports = free_port(), free_port()
        services = {f"fleet-{i}": s for i, s in enumerate(started)}
        gateways = {
            "gateway-pg": Service(
                "gateway",
                [*common, "--port", str(ports[0]), "--search-model", MODEL],
                logs,
                {"EMBEDFLEET_SEARCH_SINK": pg_url},
            ),
            "gateway-qdrant": Service("gateway", [*common, "--port", str(ports[1]), "--search-sink", qdrant_url], logs),
        }
        services |= gateways
        bases = [f"http://127.0.0.1:{p}" for p in ports]
        try:
            wait_until(lambda: all(healthy(b) for b in bases), 120, "the search gateways", list(services.values()))
            yield Fleet(plain, bases[0], bases[1], pg_url, pg_folder, services)
        finally:
            stop_all(gateways)
            pgserver.get_server(pg_folder, cleanup_mode="stop").cleanup()


def _search(base: str, **body) -> httpx.Response:
    return httpx.post(f"{base}/v1/search", json=body, timeout=120)


def _error(r: httpx.Response, status: int, param: str | None, message: str) -> dict:
    """The OpenAI error shape with ``status``, ``param`` and a message starting with ``message``."""
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error
    assert error["message"].startswith(message), error["message"]
    return error


@pytest.mark.parametrize("store", ["pg", "qdrant"])
def test_recall_at_10_against_exact_search_and_scores_against_the_reference(fleet, corpus, reference, store):
    base = getattr(fleet, store)
    queries = reference.encode(QUERIES, normalize_embeddings=True, convert_to_numpy=True)
    recalls = []
    for text, query in zip(QUERIES, queries):
        r = _search(base, model=MODEL, query=text)  # top_k: 10 by default
        assert r.status_code == 200, r.text
        SearchAnswer.model_validate_json(r.content)  # the answer is its documented model, strictly
        body = r.json()
        assert (body["object"], body["model"]) == ("list", MODEL) and "rerank_model" not in body
        hits = body["data"]
        assert len(hits) == 10 and all(h["object"] == "search_result" for h in hits)
        rows = [int(h["id"].removeprefix("doc-")) for h in hits]
        # each row as loaded: its text and metadata, its score the reference's cosine
        assert [h["text"] for h in hits] == [corpus.texts[i] for i in rows]
        assert [h["metadata"] for h in hits] == [corpus.metadata[i] for i in rows]
        np.testing.assert_allclose([h["score"] for h in hits], corpus.vectors[rows] @ query, atol=SCORE_TOLERANCE)
        assert all(a >= b - 1e-6 for a, b in zip([h["score"] for h in hits], [h["score"] for h in hits][1:]))
        recalls.append(len({h["id"] for h in hits} & set(corpus.exact(query, 10))) / 10)
        tokens = len(reference.tokenizer(text)["input_ids"])
        assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert np.mean(recalls) >= 0.95, recalls
    assert r.headers["x-search-time"].isdigit() and "x-inference-time" in r.headers


@pytest.mark.parametrize("store", ["pg", "qdrant"])
def test_filters_keep_the_rows_whose_metadata_has_the_values(fleet, corpus, reference, store):
    base = getattr(fleet, store)
    query = reference.encode([QUERIES[0]], normalize_embeddings=True)[0]
    for where in ({"kind": "passage"}, {"even": False, "kind": "passage"}, {"n": 7}, {"kind": "no such kind"}):
        r = _search(base, model=MODEL, query=QUERIES[0], top_k=5, filter=where)
        assert r.status_code == 200, r.text
        hits = r.json()["data"]
        assert all(all(h["metadata"][f] == v for f, v in where.items()) for h in hits), (where, hits)
        exact = corpus.exact(query, 5, where)
        assert len(hits) == len(exact) and len({h["id"] for h in hits} & set(exact)) >= len(exact) - 1, (where, hits)
    assert [h["id"] for h in _search(base, model=MODEL, query=QUERIES[0], filter={"n": 7}).json()["data"]] == ["doc-7"]


@pytest.mark.parametrize("store", ["pg", "qdrant"])
def test_rerank_orders_and_scores_the_candidates_as_v1_rerank_does(fleet, store):
    base = getattr(fleet, store)
    plain = _search(base, model=MODEL, query=QUERIES[1], top_k=20).json()["data"]
    r = _search(base, model=MODEL, query=QUERIES[1], top_k=20, rerank={"model": RERANKER, "top_n": 8})
    assert r.status_code == 200, r.text
    SearchAnswer.model_validate_json(r.content)
    body = r.json()
    assert (body["model"], body["rerank_model"]) == (MODEL, RERANKER) and "x-rerank-time" in r.headers
    reranked = body["data"]
    want = httpx.post(
        f"{base}/v1/rerank",
        json={"model": RERANKER, "query": QUERIES[1], "top_n": 8, "documents": [h["text"] for h in plain]},
        timeout=120,
    ).json()["results"]
    assert [h["id"] for h in reranked] == [plain[x["index"]]["id"] for x in want]
    np.testing.assert_allclose([h["rerank_score"] for h in reranked], [x["relevance_score"] for x in want], atol=1e-6)
    by_id = {h["id"]: h for h in plain}
    assert all(h["score"] == by_id[h["id"]]["score"] and h["text"] == by_id[h["id"]]["text"] for h in reranked)
    assert [h["id"] for h in reranked] != [h["id"] for h in plain[:8]]  # the reranker's order is its own
    every = _search(base, model=MODEL, query=QUERIES[1], top_k=20, rerank={"model": RERANKER}).json()["data"]
    assert sorted(h["id"] for h in every) == sorted(by_id)  # no top_n: every candidate, reranked


def test_the_model_is_pinned_or_the_request_s(fleet):
    pinned = _search(fleet.pg, query=QUERIES[2], top_k=3)  # no model: --search-model
    assert pinned.status_code == 200 and pinned.json()["model"] == MODEL, pinned.text
    assert _search(fleet.pg, model=f"sentence-transformers/{MODEL}", query=QUERIES[2], top_k=3).status_code == 200
    _error(
        _search(fleet.pg, model=RERANKER, query="q"),
        400,
        "model",
        f"the search store holds vectors of {MODEL}: leave 'model' out or name that one",
    )
    _error(
        _search(fleet.qdrant, model="no-such-model", query="q"),
        404,
        "model",
        "model 'no-such-model' is not served here",
    )
    _error(_search(fleet.qdrant, model=RERANKER, query="q"), 400, "model", f"{RERANKER} is a cross-encoder")


def test_rerank_models_that_are_no_rerankers_are_refused(fleet):
    _error(
        _search(fleet.pg, query="q", rerank={"model": MODEL}),
        400,
        "rerank.model",
        f"{MODEL} is no reranker (its kind is embedding): 'rerank.model' names a cross-encoder ({RERANKER})",
    )
    _error(
        _search(fleet.pg, query="q", rerank={"model": "nobody"}), 404, "rerank.model", "model 'nobody' is not served"
    )


@pytest.mark.parametrize(
    "body, param, message",
    [
        ({}, "query", "'query' is required"),
        ({"query": "q", "top_k": 0}, "top_k", "'top_k' must be at least 1, got 0"),
        (
            {"query": "q", "filter": {"kind": 1.5}},
            "filter",
            "'filter.kind' must be a string, an integer (64 bits) or a boolean",
        ),
        ({"query": "q", "filter": {"a.b": 1}}, "filter", "'filter' field 'a.b' is not a plain name"),
        (
            {"query": "q", "rerank": {"model": RERANKER, "top_n": -1}},
            "rerank.top_n",
            "'rerank.top_n' must be at least 1, got -1",
        ),
    ],
)
def test_bad_fields_are_400_naming_the_field(fleet, body, param, message):
    _error(httpx.post(f"{fleet.pg}/v1/search", json=body, timeout=30), 400, param, message)


def test_every_field_at_its_extremes_gets_a_2xx_or_4xx(fleet):
    schema = httpx.get(f"{fleet.pg}/openapi.json").json()["paths"]["/v1/search"]["post"]["requestBody"]["content"]
    fields = sorted(schema["application/json"]["schema"]["properties"])
    assert fields == ["filter", "model", "query", "rerank", "table", "top_k"]
    with httpx.Client(base_url=fleet.pg, timeout=120) as client, ThreadPoolExecutor(4) as pool:
        failures = [
            f
            for f in pool.map(
                lambda case: _failure(client, "/v1/search", *case), [(f, v) for f in fields for v in EXTREMES]
            )
            if f is not None
        ]
    assert not failures, failures[:10]
    assert all(s.alive for s in fleet.services.values())


def test_a_gateway_without_a_store_says_how_to_serve_search(fleet):
    error = _error(
        _search(fleet.plain, model=MODEL, query="q"),
        404,
        None,
        "search is not served here: start the gateway with --search-sink URL",
    )
    assert error["code"] == "not_found"
    assert "search" not in httpx.get(f"{fleet.plain}/v1/models", timeout=10).json()


def test_v1_models_says_which_store_and_model_without_its_address(fleet):
    """Any key reads /v1/models: the store's kind and table, none of its address, user, path or password."""
    pg = httpx.get(f"{fleet.pg}/v1/models", timeout=10).json()["search"]
    assert pg == {"route": "/v1/search", "store": "postgresql", "table": "docs", "model": MODEL}
    qdrant = httpx.get(f"{fleet.qdrant}/v1/models", timeout=10).json()["search"]
    assert qdrant == {"route": "/v1/search", "store": "qdrant", "table": "docs", "model": None}


def test_the_readme_example_runs_as_typed(fleet):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## Search\n", 1)[1].split("\n## ", 1)[0]
    (command,) = re.findall(r"^curl -s localhost:8080/v1/search .*$", section, re.M)
    done = subprocess.run(
        ["bash", "-c", command.replace("localhost:8080", fleet.pg.removeprefix("http://"))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    hits = json.loads(done.stdout)["data"]
    assert len(hits) == 3 and all(h["metadata"]["kind"] == "passage" and h["text"] for h in hits), hits


def test_a_store_down_is_503_with_its_message_and_served_again_when_back(fleet):
    """Last: the PostgreSQL server stops, then starts again on the same socket."""
    assert _search(fleet.pg, query=QUERIES[3]).status_code == 200
    pgserver.get_server(fleet.pg_folder).cleanup()
    down = _error(
        _search(fleet.pg, query=QUERIES[3]),
        503,
        None,
        f"the search store is unavailable, try again later: PostgreSQL at {fleet.pg_url.replace(PASSWORD, '***')}",
    )
    assert down["type"] == "service_unavailable" and PASSWORD not in down["message"]
    assert _search(fleet.qdrant, model=MODEL, query=QUERIES[3]).status_code == 200  # the other store is not at fault
    pgserver.get_server(fleet.pg_folder, cleanup_mode="stop")
    back = _search(fleet.pg, query=QUERIES[3])
    assert back.status_code == 200 and len(back.json()["data"]) == 10, back.text
    logs = fleet.services["gateway-pg"].log()
    assert "postgres:***@" in logs and PASSWORD not in logs
