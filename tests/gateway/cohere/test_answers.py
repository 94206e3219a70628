"""The Cohere routes' answers (and /v1/rerank's, Cohere v1's and Jina's shape) as typed models:
/openapi.json's 200 schemas are the models', and what the routes write (cohere_api.render_embed,
cohere_api.render_rerank, rerank_api.render_cohere) holds to them, strictly: v1's plain floats, rows by
type for every embedding_type alone and together, v2's inputs and chunk places, rankings with and without
documents."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from pydantic import ValidationError

from embedfleet.services.gateway.cohere.answers import (
    CohereEmbedByType,
    CohereEmbedV1Answer,
    CohereRerankV2Answer,
    RerankV1Answer,
)
from embedfleet.services.gateway.cohere.api import parse_embed, render_embed, render_rerank
from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.rerank.api import parse_cohere, render_cohere
from embedfleet.shared.text_chunks import TextChunk
from embedfleet.shared.vectors.forms import COHERE_TYPES
from embedfleet.shared.vectors.quantize import quantize
from tests.gateway.served_answers import assert_holds, assert_served_answer_is

LIMITS = Limits(max_inputs=4, max_input_chars=50)
TYPES = list(COHERE_TYPES)  # float, int8, uint8, binary, ubinary, base64


def _floats(n: int, dim: int = 20) -> np.ndarray:
    rows = np.random.default_rng(n).standard_normal((n, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _embed(doc: dict, version: int, chunks: list | None = None) -> bytes:
    """The route's answer to ``doc``: rows made in the request's form (quantized here from float32, as the
    worker would), rendered as app.py renders them."""
    req = parse_embed(orjson.dumps(doc), LIMITS, version)
    rows = sum(len(c) for c in chunks) if chunks is not None else len(req.inputs.texts)
    return render_embed(req, "req-1", quantize(_floats(rows), req.form), req.form, 9, chunks)


@pytest.mark.parametrize(
    "path, model",
    [
        ("/v1/embed", CohereEmbedV1Answer),
        ("/v2/embed", CohereEmbedByType),
        ("/v2/rerank", CohereRerankV2Answer),
        ("/v1/rerank", RerankV1Answer),
    ],
)
def test_served_answers_are_the_models(path, model):
    assert_served_answer_is(path, model)


def test_v1_plain_floats_hold_to_v1_s_model_only():
    body = _embed({"texts": ["a", "b"]}, 1)
    assert assert_holds(CohereEmbedV1Answer, body)["response_type"] == "embeddings_floats"
    with pytest.raises(ValidationError):
        CohereEmbedByType.model_validate_json(body)  # v2 answers rows by type only


@pytest.mark.parametrize("types", [[t] for t in TYPES] + [TYPES, ["base64", "int8"]], ids=str)
@pytest.mark.parametrize("version", [1, 2])
def test_rows_by_type_hold_to_the_model(types, version):
    body = _embed({"texts": ["a", "b", "c"], "embedding_types": types}, version)
    answer = assert_holds(CohereEmbedV1Answer if version == 1 else CohereEmbedByType, body)
    assert list(answer["embeddings"]) == types
    by_type = answer["embeddings"]
    for kind in types:  # each type's key is the model's: renamed, null or rows of another kind, it is refused
        rest = {k: v for k, v in by_type.items() if k != kind}
        unlike = ["AAAA"] if kind == "float" else [[0.5]]  # base64 for float rows; fractions for bytes or base64
        for wrong in ({**rest, f"{kind}s": by_type[kind]}, {**rest, kind: None}, {**rest, kind: unlike}):
            with pytest.raises(ValidationError):
                CohereEmbedByType.model_validate_json(orjson.dumps({**answer, "embeddings": wrong}))


def test_v2_inputs_and_defaults_answer_float_rows_by_type():
    body = _embed({"inputs": [{"content": [{"type": "text", "text": "a"}]}]}, 2)
    assert CohereEmbedByType.model_validate_json(body).embeddings.float is not None


@pytest.mark.parametrize("types", [["float"], TYPES], ids=str)
def test_v2_chunk_rows_name_where_they_lie(types):
    chunks = [[TextChunk(0, 6, 0, 2), TextChunk(2, 10, 1, 3)], [TextChunk(0, 1, 0, 1)]]
    doc = {"texts": ["a long one", "b"], "embedding_types": types, "chunking": {"size": 4}}
    answer = assert_holds(CohereEmbedByType, _embed(doc, 2, chunks))
    assert [c["chunk"] for c in answer["chunks"]] == [0, 1, 0]
    wrong = [{**c, "text": "a"} for c in answer["chunks"]]
    with pytest.raises(ValidationError):
        CohereEmbedByType.model_validate_json(orjson.dumps({**answer, "chunks": wrong}))


@pytest.mark.parametrize("ranked", [2, 0], ids=["documents", "none"])
def test_v2_rerank_answers_hold_to_the_model(ranked):
    body = render_rerank("id-7", np.array([1, 0][:ranked], np.int32), np.array([0.75, 0.5][:ranked], np.float32))
    answer = assert_holds(CohereRerankV2Answer, body)
    assert len(answer["results"]) == ranked


@pytest.mark.parametrize("return_documents", [True, False, None])
def test_v1_rerank_answers_hold_to_the_model(return_documents):
    doc = {"query": "q", "documents": ["a", {"text": "b"}], "return_documents": return_documents}
    call = parse_cohere(orjson.dumps({k: v for k, v in doc.items() if v is not None}), LIMITS)
    body = render_cohere(call, "m", "id-1", np.array([1, 0], np.int32), np.array([0.75, 0.5], np.float32))
    answer = assert_holds(RerankV1Answer, body)
    assert [("document" in r) for r in answer["results"]] == [bool(return_documents)] * 2
    result = answer["results"][0]
    for wrong in ({**result, "score": 0.5}, {**result, "document": "b"}, {**result, "document": {"texts": "b"}}):
        with pytest.raises(ValidationError):
            RerankV1Answer.model_validate_json(orjson.dumps({**answer, "results": [wrong]}))
