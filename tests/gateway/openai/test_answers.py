"""The OpenAI routes' answers as typed models: /openapi.json's 200 schemas are the models', and what the
routes write (openai_api.render_embeddings, models_api.render_models) holds to them, strictly, in every
variant: float and base64 rows of every embedding_type, chunk rows with their places, a row per input of
return 'mean', a model list with and without search and a classifier's labels."""

from __future__ import annotations

import base64
import typing

import numpy as np
import orjson
import pytest
from pydantic import ValidationError

from embedfleet.services.gateway.chunking import mean_of_chunks
from embedfleet.services.gateway.openai.answers import (
    ModelCard,
    ModelList,
    OpenAIEmbedding,
    OpenAIEmbeddings,
    SearchCard,
)
from embedfleet.services.gateway.openai.api import render_embeddings
from embedfleet.services.gateway.openai.models import KINDS, render_models
from embedfleet.services.gateway.search.serving import Search
from embedfleet.services.gateway.search.store import SearchTables
from embedfleet.shared.text_chunks import TextChunk
from embedfleet.shared.vectors.forms import FORMS
from embedfleet.shared.vectors.quantize import quantize
from tests.gateway.served_answers import assert_holds, assert_served_answer_is

# two inputs: the first in two chunks, the second in one
CHUNKS = [[TextChunk(0, 6, 0, 2), TextChunk(2, 10, 1, 3)], [TextChunk(0, 1, 0, 1)]]


def _rows(n: int, dim: int = 20) -> np.ndarray:
    rows = np.random.default_rng(n).standard_normal((n, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.mark.parametrize("path", ["/v1/embeddings", "/embeddings"])
def test_served_embeddings_answer_is_the_model_s(path):
    assert_served_answer_is(path, OpenAIEmbeddings)


def test_served_models_answer_is_the_model_s():
    assert_served_answer_is("/v1/models", ModelList, "get")


@pytest.mark.parametrize("encoding", ["float", "base64"])
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("chunked", [False, True], ids=["per input", "chunks"])
def test_embeddings_answers_hold_to_the_model(encoding, form, chunked):
    floats = _rows(3)
    answer = assert_holds(
        OpenAIEmbeddings,
        render_embeddings("m", quantize(floats, form), 11, encoding, form, CHUNKS if chunked else None),
    )
    item = answer["data"][0]
    assert isinstance(item["embedding"], str if encoding == "base64" else list)
    assert ("chunk" in item) is chunked
    for key in item:  # each item's keys are the model's too
        others = {k: v for k, v in item.items() if k != key}
        for wrong in ({**others, f"{key}s": item[key]}, {**item, "extra": 1}):
            with pytest.raises(ValidationError):
                OpenAIEmbeddings.model_validate_json(orjson.dumps({**answer, "data": [wrong]}))


def test_return_mean_answers_a_row_per_input():
    """'mean': the chunks' rows averaged into a row per input, rendered without places (app.py passes no chunks)."""
    means = mean_of_chunks(_rows(3), CHUNKS, normalize=True)
    answer = OpenAIEmbeddings.model_validate_json(render_embeddings("m", means, 5, "float", "float32"))
    assert [type(d) for d in answer.data] == [OpenAIEmbedding, OpenAIEmbedding]


def test_an_answer_mixing_per_input_and_chunk_rows_is_refused():
    one = orjson.loads(render_embeddings("m", _rows(1), 1, "base64", "float32"))
    chunks = orjson.loads(render_embeddings("m", _rows(3), 1, "base64", "float32", CHUNKS))
    with pytest.raises(ValidationError):
        OpenAIEmbeddings.model_validate_json(orjson.dumps({**one, "data": one["data"] + chunks["data"]}))


def test_a_row_that_is_neither_numbers_nor_base64_is_refused():
    answer = orjson.loads(render_embeddings("m", _rows(1), 1, "float", "float32"))
    answer["data"][0]["embedding"] = {"float": base64.b64encode(b"1234").decode()}
    with pytest.raises(ValidationError):
        OpenAIEmbeddings.model_validate_json(orjson.dumps(answer))


TOKENIZERS = {
    "e5": {"max_seq_length": "512", "prompts": "query,document"},
    "nli": {"max_seq_length": "256"},
    "old": {"max_seq_length": "n/a"},
}
WORKERS = {
    "e5": {"dim": "768", "task": "embed", "outputs": "dense,sparse,multivector"},
    "nli": {"dim": "3", "task": "score", "labels": '["entailment", "neutral", "contradiction"]'},
    "old": {},
}


def _search_card(pinned: str | None) -> dict[str, object]:
    """What app.py lists as 'search': the card of a real Search (its store is not reached to make it)."""
    return Search(SearchTables("postgresql://u:pw@db:5432/docs?table=t"), pinned).card()


def test_the_search_card_holds_to_the_model():
    for pinned in (None, "e5"):
        assert_holds(SearchCard, orjson.dumps(_search_card(pinned)))


@pytest.mark.parametrize("pinned", [None, "e5"], ids=["no search", "search"])
def test_models_answers_hold_to_the_model(pinned):
    search = None if pinned is None else _search_card(pinned)
    body = orjson.dumps(render_models(["e5", "nli", "old"], TOKENIZERS, WORKERS, "e5", search))  # as app.py writes it
    answer = assert_holds(ModelList, body)
    assert ("search" in answer) is (search is not None)
    cards = answer["data"]
    assert [("labels" in c, c["dimensions"], c["max_tokens"]) for c in cards] == [
        (False, 768, 512),
        (True, 3, 256),
        (False, None, None),  # a process that says little: null, not left out
    ]
    for card in cards:
        for key in card:
            others = {k: v for k, v in card.items() if k != key}
            with pytest.raises(ValidationError):
                ModelList.model_validate_json(orjson.dumps({**answer, "data": [{**others, f"{key}s": card[key]}]}))
    assert ModelList.model_validate_json(orjson.dumps(render_models([], {}, {}, None))).data == []


def test_the_kinds_are_the_ones_models_api_tells():
    assert typing.get_args(ModelCard.model_fields["kind"].annotation) == KINDS
