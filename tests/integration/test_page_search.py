"""docs/search.md's "Pages (ColQwen2)" run as typed on a real stack: its `up` line in a fresh folder (the
stack's data in its .embedfleet, under the test's tmp_path) holding a tiny ColQwen2 folder where the page
says ./colqwen2 is and PAGES page images of many sizes under pages/, then its second terminal's lines
through bash (only the page's port 8080 becomes the test's free port): the reindex fills a LanceDB table
of multi-vectors and the search answers the pages ranked as transformers' ColQwen2Processor.score_retrieval
ranks ColQwen2ForRetrieval's vectors of the same files and query. A second query the same; GET /v1/models
names the store; a dense model (a tiny BERT joined to the stack) over the pages and the page model over a
dense table are refused naming the model. The same job loaded again into a Qdrant local-mode folder, and a
second gateway on the stack searching it (Qdrant's MAX_SIM), answers as the LanceDB table does."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from embedfleet.shared.nats.local_stack import read_stack
from embedfleet.shared.nats.server import free_port
from embedfleet.shared.sinks import Rows, Shape, sink_for
from tests.integration.test_walkthrough import _blocks, _section, _terminal, _typed
from tests.support import tiny_models
from tests.support.image_files import noise_files, write_files
from tests.support.page_models import build_colqwen2, reference, reference_vectors
from tests.support.procs import Service, healthy, wait_until

pytestmark = pytest.mark.integration

MODEL, DENSE = "colqwen2", "mini"
PAGES = 12
SIDES = (24, 260)  # pixels a side: pages of 4 to 64 image tokens, each its own grid
TOP = 5  # the page's top_k
SCORE_TOLERANCE = 1e-3  # a hit's score against score_retrieval's over transformers' vectors
SECOND_QUERY = "a chart of rainfall by month"


@dataclass
class PageStack:
    work: Path  # the newcomer's folder: ./colqwen2, pages/, .embedfleet/, pages.lance/
    base: str
    port: int  # the stack's gateway's
    block: str  # the page's second terminal
    outputs: list[str]  # its lines' outputs, in order
    pages: dict[str, Path]  # id (the path under pages/) -> file
    dense: list[Service]  # the tiny BERT's tokenizer and worker, joined to the stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[PageStack]:
    work = tmp_path_factory.mktemp("page-search")
    (work / ".venv").symlink_to(sys.prefix)  # where the page's .venv/bin/embedfleet is
    build_colqwen2(work)  # ./colqwen2
    names = [f"{'scans/' if i % 4 == 0 else ''}page{i:02d}" for i in range(PAGES)]
    paths = write_files(work / "pages", noise_files(PAGES, seed=11, sides=SIDES), names)
    pages = {p.relative_to(work / "pages").as_posix(): p for p in paths}
    start, second = _blocks(_section("Pages (ColQwen2)"), "sh")
    port = free_port()
    log = work / "up.log"
    up = subprocess.Popen(
        ["bash", "-c", start.strip()],
        cwd=work,
        env=_terminal(port),
        stdout=open(log, "wb"),  # noqa: SIM115 (the child holds it)
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a terminal's process group: Ctrl-C reaches all of it
    )
    dense: list[Service] = []
    try:
        wait_until(lambda: "embedfleet is up" in log.read_text() or up.poll() is not None, 120, "the stack")
        assert up.poll() is None, log.read_text()[-4000:]
        dense = _join_dense_model(work)
        outputs = _typed(work, second, port)
        yield PageStack(work, f"http://127.0.0.1:{port}", port, second, outputs, pages, dense)
    finally:
        for service in dense:
            service.stop()
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()


def _join_dense_model(work: Path) -> list[Service]:
    """A tiny BERT (dense vectors only) served beside the page model: a tokenizer and a worker on the
    stack's NATS, found (with its token) from the record `up` wrote in .embedfleet."""
    found = read_stack(work / ".embedfleet")
    assert found is not None and found.token_file is not None
    folder = tiny_models.build("bert", work / "dense")
    args = ["--nats", found.url, "--nats-token-file", found.token_file, "--model", str(folder), "--model-name", DENSE]
    logs = work / "logs"
    logs.mkdir()
    worker = [*args, "--max-batch-tokens", "2048"]  # given: no calibration, which would keep its curve in ./.embedfleet
    return [Service("tokenizer", args, logs), Service("worker", worker, logs, {"OMP_NUM_THREADS": "1"})]


@pytest.fixture(scope="module")
def theirs(stack):
    """transformers' ColQwen2 (model, processor) for the stack's ./colqwen2, and its vectors of each page."""
    from PIL import Image

    model, processor = reference(stack.work / MODEL)
    vectors = {
        d: reference_vectors(model, processor.process_images([Image.open(p).convert("RGB")]))
        for d, p in stack.pages.items()
    }
    return model, processor, vectors


def _expected(theirs, query: str) -> list[tuple[str, float]]:
    """Every page with score_retrieval's score of it for ``query`` over transformers' vectors, best first."""
    import torch

    model, processor, pages = theirs
    ids = sorted(pages)
    asked = reference_vectors(model, processor.process_queries([query]))
    scores = processor.score_retrieval([torch.from_numpy(asked)], [torch.from_numpy(pages[d]) for d in ids])[0]
    return sorted(zip(ids, scores.tolist()), key=lambda pair: -pair[1])


def _check(answer: dict, expected: list[tuple[str, float]], top_k: int) -> None:
    """The answer's rows are the reference's best, in its order, each score the reference's; pages, no text."""
    hits = answer["data"]
    assert answer["model"] == MODEL and len(hits) == top_k, answer
    assert [h["id"] for h in hits[:TOP]] == [d for d, _ in expected[:TOP]], (hits, expected)
    scores = dict(expected)
    for hit in hits:
        assert abs(hit["score"] - scores[hit["id"]]) < SCORE_TOLERANCE, (hit, scores[hit["id"]])
        assert "text" not in hit and hit["metadata"] == {} and hit["object"] == "search_result", hit
    assert answer["usage"]["prompt_tokens"] > 0


def test_the_docs_pages_example_runs_as_typed_and_ranks_as_score_retrieval(stack, theirs):
    reindex, search = stack.outputs
    assert "reindex pages --output multivector --sink" in stack.block
    table = f"lancedb://{stack.work}/pages.lance?table=pages"
    assert f"-> {table} ({PAGES} rows)" in reindex, reindex
    sent = re.search(r"-d '(\{.*\})'", stack.block.strip().splitlines()[-1])
    assert sent is not None, stack.block
    query = json.loads(sent.group(1))
    assert query["top_k"] == TOP
    _check(json.loads(search), _expected(theirs, query["query"]), TOP)


def test_a_second_query_ranks_every_page_as_score_retrieval(stack, theirs):
    reply = httpx.post(
        f"{stack.base}/v1/search", json={"model": MODEL, "query": SECOND_QUERY, "top_k": PAGES}, timeout=60
    )
    assert reply.status_code == 200, reply.text
    assert {"x-search-time", "x-inference-time"} <= set(reply.headers), reply.headers
    _check(reply.json(), _expected(theirs, SECOND_QUERY), PAGES)


def test_v1_models_names_the_store_and_its_table(stack):
    reply = httpx.get(f"{stack.base}/v1/models", timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.json()["search"] == {"route": "/v1/search", "store": "lancedb", "table": "pages", "model": None}


def test_a_dense_model_over_the_pages_and_the_page_model_over_a_dense_table_are_refused(stack):
    def dense_served() -> bool:
        models = httpx.get(f"{stack.base}/v1/models", timeout=10).json()["data"]
        return any(m["id"] == DENSE for m in models)

    wait_until(dense_served, 60, "the dense model", stack.dense)
    shown = f"lancedb://{stack.work}/pages.lance"
    refused = httpx.post(f"{stack.base}/v1/search", json={"model": DENSE, "query": "revenue"}, timeout=60)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "model"
    assert refused.json()["error"]["message"] == (
        f"{DENSE} makes no multi-vectors (it makes: dense); the search store {shown}?table=pages holds a vector "
        "per token of each row, searched by MaxSim: search with the multi-vector model that filled it"
    )
    sink = sink_for(f"{shown}?table=dense")  # a dense table beside the pages, of the page model's width
    sink.open(Shape("float32", "dense", 128))
    sink.write(Rows(["a", "b"], np.eye(2, 128, dtype=np.float32)))
    sink.close()
    wrong = httpx.post(f"{stack.base}/v1/search", json={"query": "revenue", "table": "dense"}, timeout=60)
    assert wrong.status_code == 400, wrong.text
    assert wrong.json()["error"]["message"] == (
        f"{MODEL} makes no dense vectors (it makes: multivector); the search store {shown}?table=dense holds "
        "dense vectors: search with the model that filled it"
    )
    still = httpx.post(f"{stack.base}/v1/search", json={"query": SECOND_QUERY, "top_k": 1}, timeout=60)
    assert still.status_code == 200 and len(still.json()["data"]) == 1, still.text


def test_the_same_job_in_a_qdrant_collection_is_searched_as_the_lancedb_table(stack, theirs):
    """The page's reindex line with a Qdrant local-mode folder for its sink (the same job: its results read
    again from the results stream), then a gateway joined to the stack with that folder for its store (the
    reindex closed it: local mode opens a folder in one process at a time)."""
    reindex = next(line for line in stack.block.splitlines() if " reindex " in line)
    lance = '"lancedb://$PWD/pages.lance?table=pages"'
    assert lance in reindex, reindex
    (loaded,) = _typed(stack.work, reindex.replace(lance, '"qdrant://$PWD/pages.qdrant?collection=pages"'), stack.port)
    collection = f"qdrant://{stack.work}/pages.qdrant?collection=pages"
    assert f"-> {collection} ({PAGES} rows)" in loaded, loaded
    found = read_stack(stack.work / ".embedfleet")
    assert found is not None and found.token_file is not None
    port = free_port()
    args = ["--nats", found.url, "--nats-token-file", found.token_file, "--port", str(port)]
    gateway = Service("gateway", [*args, "--search-sink", collection], stack.work / "logs")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthy(base), 120, "the Qdrant gateway", [gateway])
        models = httpx.get(f"{base}/v1/models", timeout=10).json()
        assert models["search"] == {"route": "/v1/search", "store": "qdrant", "table": "pages", "model": None}
        body = {"model": MODEL, "query": SECOND_QUERY, "top_k": PAGES}
        reply = httpx.post(f"{base}/v1/search", json=body, timeout=60)
        assert reply.status_code == 200, (reply.text, gateway.log()[-3000:])
        _check(reply.json(), _expected(theirs, SECOND_QUERY), PAGES)
        lancedb = httpx.post(f"{stack.base}/v1/search", json=body, timeout=60)
        assert lancedb.status_code == 200, lancedb.text
        ours = [(h["id"], h["score"]) for h in reply.json()["data"]]
        lance_hits = [(h["id"], h["score"]) for h in lancedb.json()["data"]]
        assert [d for d, _ in ours[:TOP]] == [d for d, _ in lance_hits[:TOP]]
        np.testing.assert_allclose([v for _, v in ours], [v for _, v in lance_hits], atol=SCORE_TOLERANCE)
        filtered = httpx.post(f"{base}/v1/search", json={**body, "filter": {"lang": "en"}}, timeout=60)
        assert filtered.status_code == 200 and filtered.json()["data"] == [], filtered.text  # pages carry none
    finally:
        gateway.stop()
