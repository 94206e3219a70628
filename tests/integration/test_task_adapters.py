"""Task adapters through a real `embedfleet up` (gateway, tokenizers and workers as processes) serving a
tiny jina-embeddings-v3 folder with its five task adapters in the published layout (and beside it a
jina-embeddings-v5-text-nano folder with its four PEFT adapters, and the EuroBERT it is made of): each route's way
of choosing a task (OpenAI's and Cohere's ``task``, the input types, TEI's ``prompt_name``) gives the
vectors of sentence-transformers on the model with that task's adapter merged into its weights and
that task's prompt (cosine >= 0.9999, fp32); requests of different tasks at once each get their own;
a task the model lacks is refused in each API's error shape naming those it has; a forged token batch
naming an unknown task is refused by the worker, which goes on serving."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats
import numpy as np
import pytest
from safetensors.torch import load_file

from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.nats.local_stack import read_stack
from embedfleet.shared.nats.server import free_port
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import EmbedOptions, ErrorReply, TokenChunk, decode, encode
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import mixed_texts
from tests.support.procs import Service, wait_until
from tests.support.task_adapters import TASKS, V5_TASKS, merged, random_pairs, v5_folders, with_adapters
from tests.support.tiny_models import build, st_reference

pytestmark = pytest.mark.integration

MODEL = "jina"
TEXTS = mixed_texts(6)  # a query to a document cut at the model's limit


@dataclass
class Stack:
    base_url: str
    data: Path
    references: dict[str | None, np.ndarray]  # task (None: the base model) -> sentence-transformers' vectors
    v5: dict[str | None, Path]  # the v5 folder ("v5"), its EuroBERT (None) and each task merged into it


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("tasks")
    base = build("jina_embeddings_v3", root / "models")
    pairs = random_pairs(load_file(base / "model.safetensors"))
    adapted = with_adapters(base, root / "jina-adapted", pairs)
    # each task's reference: its adapter merged into the weights, the texts behind the task's prompt
    references: dict[str | None, np.ndarray] = {None: st_reference(base, TEXTS)}
    for i, task in enumerate(TASKS):
        references[task] = st_reference(merged(base, root / f"merged-{i}", pairs, i), TEXTS, task)
    v5 = v5_folders(root / "v5")
    data, port = root / "data", free_port()
    models = ["--model", f"{MODEL}={adapted}", "--model", f"v5={v5['v5']}", "--model", f"euro={v5[None]}"]
    up = Service(
        "up",
        ["--data-dir", str(data), "--port", str(port), *models],
        root,
        {"EMBEDFLEET_MAX_BATCH_TOKENS": "2048", "OMP_NUM_THREADS": "1"},
    )
    try:
        wait_until(lambda: "embedfleet is up" in up.log(), 300, "the stack", [up])
        yield Stack(f"http://127.0.0.1:{port}", data, references, v5)
    finally:
        assert up.stop(60) == 0, up.log()[-3000:]


def _openai(stack: Stack, model: str = MODEL, **fields) -> np.ndarray:
    r = httpx.post(f"{stack.base_url}/v1/embeddings", json={"model": model, "input": TEXTS, **fields}, timeout=60)
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]])


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(cosines(got, want).min() >= COSINE_TOLERANCE)


def test_models_list_the_tasks(stack):
    models = {m["id"]: m["tasks"] for m in httpx.get(f"{stack.base_url}/v1/models", timeout=30).json()["data"]}
    assert models == {MODEL: TASKS, "v5": list(V5_TASKS), "euro": []}


def test_jina_v5_tasks_with_its_query_and_document_prompts(stack):
    """v5's one retrieval adapter takes both sides, each with its prompt; Jina's v3 names reach it too."""
    v5 = stack.v5

    def want(task: str | None, prompt: str | None) -> np.ndarray:
        return st_reference(v5[task], TEXTS, prompt)

    assert _close(_openai(stack, "v5", input_type="query"), want("retrieval", "query"))
    assert _close(_openai(stack, "v5", task="retrieval.passage"), want("retrieval", "document"))
    assert _close(_openai(stack, "v5", task="text-matching"), want("text-matching", None))  # its default prompt
    assert _close(_openai(stack, "v5"), want(None, None))  # no task: the base model, the document prompt
    # Cohere's clustering: the clustering adapter; no prompt of that name, so none (as for any model)
    r = httpx.post(f"{stack.base_url}/v2/embed", json={"model": "v5", "texts": TEXTS, "input_type": "clustering"})
    assert r.status_code == 200, r.text
    from sentence_transformers import SentenceTransformer

    plain = SentenceTransformer(str(v5["clustering"]), device="cpu").encode(TEXTS, prompt="")
    assert _close(np.array(r.json()["embeddings"]["float"]), plain)


def test_eurobert_serves_through_up(stack):
    assert _close(_openai(stack, "euro", input_type="query"), st_reference(stack.v5[None], TEXTS, "query"))
    r = httpx.post(f"{stack.base_url}/v1/embeddings", json={"model": "euro", "input": ["a"], "task": "retrieval"})
    assert r.status_code == 400 and "its tasks: none: it has no task adapters" in r.text, r.text


@pytest.mark.parametrize("task", TASKS)
def test_openai_task_gives_that_adapters_vectors(stack, task):
    got = _openai(stack, task=task)
    assert _close(got, stack.references[task])
    others = [t for t in TASKS if t != task]
    assert all(cosines(got, stack.references[t]).min() < 0.999 for t in others)  # not another task's


def test_no_task_is_the_base_model_and_input_types_choose_the_retrieval_adapters(stack):
    assert _close(_openai(stack), stack.references[None])
    assert _close(_openai(stack, input_type="query"), stack.references["retrieval.query"])
    assert _close(_openai(stack, input_type="document"), stack.references["retrieval.passage"])


def test_cohere_input_types_and_task(stack):
    def cohere(**fields) -> np.ndarray:
        r = httpx.post(f"{stack.base_url}/v2/embed", json={"model": MODEL, "texts": TEXTS, **fields}, timeout=60)
        assert r.status_code == 200, r.text
        return np.array(r.json()["embeddings"]["float"])

    assert _close(cohere(input_type="search_query"), stack.references["retrieval.query"])
    assert _close(cohere(input_type="search_document"), stack.references["retrieval.passage"])
    assert _close(cohere(input_type="clustering"), stack.references["separation"])
    assert _close(cohere(input_type="classification", task="text-matching"), stack.references["text-matching"])
    r = httpx.post(f"{stack.base_url}/v1/embed", json={"model": MODEL, "texts": TEXTS, "task": "separation"})
    assert r.status_code == 200, r.text
    assert _close(np.array(r.json()["embeddings"]), stack.references["separation"])


def test_tei_prompt_name_chooses_the_adapter_of_that_name(stack):
    for task in ("text-matching", "retrieval.passage"):
        r = httpx.post(f"{stack.base_url}/embed", json={"inputs": TEXTS, "prompt_name": task, "truncate": True})
        assert r.status_code == 200, r.text
        assert _close(np.array(r.json()), stack.references[task])


def test_requests_of_different_tasks_at_once_each_get_their_own(stack):
    async def all_at_once() -> list[np.ndarray]:
        async with httpx.AsyncClient(timeout=120) as client:
            answers = await asyncio.gather(
                *(
                    client.post(f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": TEXTS, "task": t})
                    for t in TASKS * 2
                )
            )
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
        return [np.array([d["embedding"] for d in a.json()["data"]]) for a in answers]

    for task, got in zip(TASKS * 2, asyncio.run(all_at_once())):
        assert _close(got, stack.references[task]), task


def test_a_task_the_model_lacks_is_refused_naming_its_tasks(stack):
    named = "its tasks: " + ", ".join(TASKS)
    r = httpx.post(f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": ["a"], "task": "summarize"})
    assert r.status_code == 400 and named in r.json()["error"]["message"], r.text
    r = httpx.post(f"{stack.base_url}/v2/embed", json={"model": MODEL, "texts": ["a"], "task": "summarize"})
    assert r.status_code == 400 and named in r.json()["message"], r.text
    r = httpx.post(f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": ["a"], "task": ""})
    assert r.status_code == 400 and "task" in r.text, r.text  # the body's own check


def test_a_forged_batch_naming_an_unknown_task_is_refused_by_the_worker(stack):
    record = read_stack(stack.data)
    assert record is not None and record.token_file is not None
    token = Path(record.token_file).read_text().strip()
    batch = TokenChunk(
        "forged",
        MODEL,
        0,
        1,
        np.array([0, 5, 6, 2], "<i4"),
        np.array([0, 4], "<i4"),
        time.time() + 30,
        EmbedOptions(task="not-an-adapter"),
    )

    async def send() -> object:
        nc = await nats.connect(record.url, token=token)
        try:
            return decode((await nc.request(Subjects().tokens(MODEL), encode(batch), timeout=30)).data)
        finally:
            await nc.close()

    reply = asyncio.run(send())
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.INVALID_REQUEST, reply
    assert "no task 'not-an-adapter'" in reply.message and ", ".join(TASKS) in reply.message
    assert _close(_openai(stack, task="classification"), stack.references["classification"])  # still serving
