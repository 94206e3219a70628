"""docs/http-api.md's chunking ``size`` row against the real stack: the room it says all-MiniLM-L6-v2 leaves a
chunk is the room the tokenizer leaves (that size taken, one more refused naming it), and every prompt
it names for the model is one the model has (/v1/models' ``prompts``)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "http-api.md"


def _size_row() -> str:
    return next(line for line in PAGE.read_text().splitlines() if line.startswith("| `size` |"))


def test_the_docs_chunk_size_row_says_what_the_model_takes(stack):
    row = _size_row()
    found = re.search(rf"at most (\d+) for {MODEL}", row)
    assert found is not None, row
    room = int(found.group(1))
    cards = httpx.get(f"{stack.base_url}/v1/models", timeout=30).json()["data"]
    prompts = next(card["prompts"] for card in cards if card["id"] == MODEL)
    for named in re.findall(r"its `(\w+)` prompt", row):
        assert named in prompts, f"docs/http-api.md names a {named!r} prompt of {MODEL}, which has {prompts}"

    def chunked(size: int) -> httpx.Response:
        body = {"model": MODEL, "input": ["word " * 600], "chunking": {"size": size}}
        return httpx.post(f"{stack.base_url}/v1/embeddings", json=body, timeout=60)

    assert chunked(room).status_code == 200
    refused = chunked(room + 1)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["message"].startswith(
        f"chunking.size is {room + 1}; this model holds at most {room} tokens of text a chunk"
    ), refused.text
