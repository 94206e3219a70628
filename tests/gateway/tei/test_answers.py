"""The TEI routes' answers are their typed models (tei/answers.py): /openapi.json's 200 schemas are the
models' generated ones, and what the renderers write validates against both the model (strictly: every
field named, of its type) and the served schema, over every variant; a wrong answer is refused."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import numpy as np
import orjson
import pytest
from pydantic import BaseModel, ValidationError

from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.openapi import typed_schema
from embedfleet.services.gateway.rerank.api import RerankCall, render_tei
from embedfleet.services.gateway.response_parts import inline_schema
from embedfleet.services.gateway.tei import answers
from embedfleet.services.gateway.tei.api import (
    render_all,
    render_embed,
    render_embed_chunks,
    render_info,
    render_sparse,
    render_tokens,
)
from embedfleet.services.gateway.tei.tasks import PredictCall, render_decode, render_predict, render_similarity
from embedfleet.shared.protocol import TokenizeResult
from embedfleet.shared.text_chunks import TextChunk
from embedfleet.shared.vectors.forms import FORMS
from embedfleet.shared.vectors.quantize import quantize
from tests.gateway.typed_bodies import resolved, served_spec

ANSWERS: dict[tuple[str, str], type[BaseModel]] = {
    ("/embed", "post"): answers.TeiEmbedAnswer,
    ("/embed_sparse", "post"): answers.TeiSparseAnswer,
    ("/embed_all", "post"): answers.TeiAllAnswer,
    ("/tokenize", "post"): answers.TeiTokenizeAnswer,
    ("/rerank", "post"): answers.TeiRerankAnswer,
    ("/predict", "post"): answers.TeiPredictAnswer,
    ("/similarity", "post"): answers.TeiSimilarityAnswer,
    ("/decode", "post"): answers.TeiDecodeAnswer,
    ("/", "post"): answers.TeiRootAnswer,
    ("/invocations", "post"): answers.TeiRootAnswer,
}
CLASSIFIER = {"task": "score", "dim": "3", "labels": json.dumps(["negative", "neutral", "positive"])}
RERANKER = {"task": "score", "dim": "1"}
RNG = np.random.default_rng(7)


def _answer_schema(spec: dict[str, Any], path: str, method: str) -> dict[str, Any]:
    return spec["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]


def _json(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value))  # as served: JSON


@pytest.mark.parametrize("where, model", ANSWERS.items(), ids=lambda x: str(x))
def test_each_routes_200_schema_is_its_models(where, model):
    spec = served_spec()
    schemas: dict[str, Any] = {}
    assert _answer_schema(spec, *where) == _json(typed_schema(model, schemas))
    for name, definition in _json(schemas).items():  # what it refers to is served as generated
        assert spec["components"]["schemas"][name] == definition


def test_infos_200_schema_is_its_models():
    assert _answer_schema(served_spec(), "/info", "get") == _json(inline_schema(answers.TeiInfo))


def test_binary_answers_keep_their_descriptions():
    spec = served_spec()
    for path in ("/embed", "/", "/invocations"):
        content = spec["paths"][path]["post"]["responses"]["200"]["content"]
        assert set(content) == {"application/json", "application/octet-stream", "application/msgpack"}
        assert content["application/octet-stream"]["schema"]["format"] == "binary"


def _held(body: bytes, model: type[BaseModel], path: str, method: str = "post") -> Any:
    """``body`` validates against ``model`` strictly and against ``path``'s served 200 schema."""
    model.model_validate_json(body)
    spec = served_spec()
    schema = resolved(_answer_schema(spec, path, method), spec["components"]["schemas"])
    jsonschema.Draft202012Validator(schema).validate(doc := orjson.loads(body))
    return doc


def _rows(form: str, n: int = 3, dim: int = 20) -> np.ndarray:
    return quantize(RNG.standard_normal((n, dim)).astype(np.float32), form)  # packed forms: [n, ceil(dim / 8)]


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("path", ["/embed", "/"])
def test_embed_answers_of_every_form_hold(form, path):
    doc = _held(render_embed(_rows(form), form), answers.TeiEmbedAnswer, path)
    assert len(doc) == 3
    chunks = [[TextChunk(0, 10, 0, 3), TextChunk(8, 20, 2, 6)], [], [TextChunk(0, 4, 0, 1)]]
    doc = _held(render_embed_chunks(_rows(form), form, chunks), answers.TeiEmbedAnswer, path)
    assert [len(c) for c in doc] == [2, 0, 1]
    _held(render_embed(np.empty((0, 8), np.float32)), answers.TeiEmbedAnswer, path)


def test_sparse_answers_hold():
    rows = [
        (np.array([3, 17, 2001], np.int32), np.array([0.5, 1.25, 0.01], np.float32)),
        (np.array([], np.int32), np.array([], np.float32)),  # everything pruned (threshold)
    ]
    for path in ("/embed_sparse", "/", "/invocations"):
        assert _held(render_sparse(rows), answers.TeiSparseAnswer, path)[0][1] == {"index": 17, "value": 1.25}


@pytest.mark.parametrize("form", ["float32", "float16", "int8", "uint8"])
def test_token_vector_answers_hold(form):
    rows = [_rows(form, 5, 8), _rows(form, 2, 8)]  # per input, a vector per token
    assert [len(r) for r in _held(render_all(rows, form), answers.TeiAllAnswer, "/embed_all")] == [5, 2]


def test_tokenize_answers_hold():
    result = TokenizeResult("x", [[(101, "[CLS]", True, None, None), (7592, "hi", False, 0, 2)], []])
    assert _held(render_tokens(result), answers.TeiTokenizeAnswer, "/tokenize")[0][0]["start"] is None


@pytest.mark.parametrize("return_text", [False, True])
@pytest.mark.parametrize("path", ["/rerank", "/", "/invocations"])
def test_rerank_answers_hold(return_text, path):
    call = RerankCall(None, "q", ["a", "b", "c"], 2, False, False, return_text)
    doc = _held(
        render_tei(call, np.array([2, 0], np.int32), np.array([0.9, 0.1], np.float32)), answers.TeiRerankAnswer, path
    )
    assert ("text" in doc[0]) is return_text
    _held(render_tei(call, np.array([], np.int32), np.array([], np.float32)), answers.TeiRerankAnswer, path)


@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("path", ["/predict", "/", "/invocations"])
def test_predict_answers_hold(batch, path):
    call = PredictCall(["a", ("q", "d")] if batch else ["a"], batch, False, False, "right")
    scores = RNG.random((2 if batch else 1, 3))
    doc = _held(render_predict(call, scores, ["negative", "neutral", "positive"]), answers.TeiPredictAnswer, path)
    assert isinstance(doc[0], list) is batch


@pytest.mark.parametrize("path", ["/similarity", "/", "/invocations"])
def test_similarity_answers_hold(path):
    v = RNG.standard_normal((4, 8)).astype(np.float32)
    assert len(_held(render_similarity(v), answers.TeiSimilarityAnswer, path)) == 3


def test_decode_answers_hold():
    assert _held(render_decode(["hello world", ""]), answers.TeiDecodeAnswer, "/decode") == ["hello world", ""]


@pytest.mark.parametrize(
    "worker, kind",
    [
        ({"max_batch_tokens": "2048", "dtype": "float16", "pooling": "cls"}, "embedding"),
        ({}, "embedding"),  # a worker that registered nothing of these: TEI's defaults
        ({"task": "embed", "outputs": "sparse"}, "embedding"),
        (CLASSIFIER, "classifier"),
        (RERANKER, "reranker"),
    ],
)
def test_info_answers_hold(worker, kind):
    body = render_info("m", {"max_seq_length": "256", "pooling": "mean"}, worker, Limits(4, 50), 64, "0.1.0")
    assert set(_held(body, answers.TeiInfo, "/info", "get")["model_type"]) == {kind}


@pytest.mark.parametrize(
    "model, answer",
    [
        (
            answers.TeiEmbedAnswer,
            [[{"index": 0, "chunk": 0, "start": 0, "end": 3, "embedding": [0.5]}]],
        ),  # ChunkPlace's
        (answers.TeiEmbedAnswer, [["0.5"]]),  # TEI has no base64
        (answers.TeiSparseAnswer, [[{"index": 1, "weight": 0.5}]]),
        (answers.TeiAllAnswer, [[0.5, 1.0]]),  # a vector per input is not per token
        (answers.TeiTokenizeAnswer, [[{"id": 1, "text": "a", "special": False, "start": 0, "end": 1}]]),
        (answers.TeiRerankAnswer, [{"index": 0, "relevance_score": 0.5}]),  # Cohere's
        (answers.TeiPredictAnswer, [{"score": 0.5, "label": "a", "index": 0}]),
        (answers.TeiSimilarityAnswer, [True]),
        (answers.TeiDecodeAnswer, [[1, 2]]),
        (answers.TeiRootAnswer, {"data": []}),
    ],
)
def test_a_wrong_answer_is_refused(model, answer):
    with pytest.raises(ValidationError):
        model.model_validate_json(orjson.dumps(answer))


def test_a_wrong_info_is_refused():
    good = orjson.loads(render_info("m", {}, {}, Limits(4, 50), 64, "0"))
    answers.TeiInfo.model_validate_json(orjson.dumps(good))
    for bad in (
        {**good, "model_sha256": None},
        {k: v for k, v in good.items() if k != "auto_truncate"},
        {**good, "max_input_length": "256"},
        {**good, "model_type": {"embedding": {"pooling": "mean"}, "reranker": {"id2label": {}, "label2id": {}}}},
    ):
        with pytest.raises(ValidationError):
            answers.TeiInfo.model_validate_json(orjson.dumps(bad))


def test_the_served_schema_refuses_a_null_text():
    """The model takes an absent text as None; the served schema says it is a string when present."""
    spec = served_spec()
    schema = resolved(_answer_schema(spec, "/rerank", "post"), spec["components"]["schemas"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"index": 0, "score": 0.5, "text": None}], schema)
