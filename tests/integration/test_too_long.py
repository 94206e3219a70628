"""An input over the model's limit with truncation off, on every route that can refuse it, on the real
stack: the error says how to cut it in the words of the route's own API (TEI's ``truncate=true``,
Cohere's ``truncate`` ``END`` / ``START``, the ``truncate`` field of /v1/rerank's body), in its error
shape and status; /v1/embeddings, which has no such field, cuts every input."""

from __future__ import annotations

import pytest

from tests.support.procs import post

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"
LONG = "word " * 600  # 602 tokens with [CLS] and [SEP]; the model takes 256
FACT = "has 602 tokens; the model's limit is 256"
TEI = "(send truncate=true to cut it)"
COHERE = '(send truncate "END" or "START" to cut it)'
OPENAI_RERANK = '(send "truncate": true to cut it)'


@pytest.mark.parametrize(
    "path, body, message",
    [
        ("/embed", {"inputs": ["a", LONG]}, f"input 1 {FACT} {TEI}"),
        ("/", {"inputs": ["a", LONG]}, f"input 1 {FACT} {TEI}"),
        ("/embed_all", {"inputs": [LONG]}, f"input 0 {FACT} {TEI}"),
        ("/similarity", {"inputs": {"source_sentence": "a", "sentences": [LONG]}}, f"input 1 {FACT} {TEI}"),
        ("/rerank", {"query": "a", "texts": ["b", LONG]}, f"candidate 1 {FACT} {TEI}"),
    ],
    ids=["embed", "root", "embed_all", "similarity", "rerank"],
)
def test_tei_routes_say_truncate_true(stack, path, body, message):
    r = post(stack.base_url, path, body, timeout=60)
    assert r.status_code == 413, r.text
    assert r.json() == {"error": message, "error_type": "Validation"}


@pytest.mark.parametrize("path", ["/v1/embed", "/v2/embed"])
def test_cohere_routes_say_truncate_end_or_start(stack, path):
    r = post(
        stack.base_url,
        path,
        {"model": MODEL, "texts": ["a", LONG], "input_type": "search_document", "truncate": "NONE"},
        timeout=60,
    )
    assert r.status_code == 400, r.text  # Cohere has no 413
    assert r.json() == {"message": f"input 1 {FACT} {COHERE}"}


def test_openai_rerank_says_its_truncate_field(stack):
    r = post(
        stack.base_url,
        "/v1/rerank",
        {"model": MODEL, "query": "a", "documents": ["b", LONG], "truncate": False},
        timeout=60,
    )
    assert r.status_code == 413, r.text
    error = r.json()["error"]
    assert (error["message"], error["code"]) == (f"candidate 1 {FACT} {OPENAI_RERANK}", "input_too_long"), error


def test_openai_embeddings_cut_what_is_too_long(stack):
    """OpenAI's body has no truncation field: /v1/embeddings cuts an input at the model's limit, and its
    usage counts the tokens embedded."""
    r = post(stack.base_url, "/v1/embeddings", {"model": MODEL, "input": [LONG]}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 256
