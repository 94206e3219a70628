"""Late-interaction reranking in-process (services/gateway/rerank/late.py): MaxSim against a plain numpy
reference, ranking with ties and top_n, which models rank by MaxSim, and /v1/rerank's image documents as
the call holds them and the answer renders them."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from PIL import Image

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.rerank.api import RerankCall, parse_cohere, render_cohere
from embedfleet.services.gateway.rerank.late import by_maxsim, maxsim, ranked, texts_only
from embedfleet.shared.errors import ErrorCode
from tests.support.image_files import data_uri, encoded

LIMITS = Limits(max_inputs=4, max_input_chars=20)


def _unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    rows = rng.standard_normal((n, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _reference(query: np.ndarray, documents: list[np.ndarray]) -> np.ndarray:
    """MaxSim as ColBERT and ColQwen2Processor.score_retrieval write it, one document at a time, in float64."""
    q = query.astype(np.float64)
    return np.array([(q @ d.astype(np.float64).T).max(axis=1).sum() for d in documents])


@pytest.mark.parametrize("seed", range(5))
def test_maxsim_equals_the_plain_reference(seed):
    rng = np.random.default_rng(seed)
    dim = int(rng.integers(4, 129))
    query = _unit_rows(rng, int(rng.integers(1, 33)), dim)
    documents = [_unit_rows(rng, int(n), dim) for n in rng.integers(1, 300, int(rng.integers(1, 40)))]
    scores = maxsim(query, documents)
    assert scores.dtype == np.float32 and scores.shape == (len(documents),)
    np.testing.assert_allclose(scores, _reference(query, documents), rtol=1e-5, atol=1e-5)


def test_a_document_of_one_token_and_the_query_itself():
    rng = np.random.default_rng(9)
    query = _unit_rows(rng, 6, 16)
    scores = maxsim(query, [query, query[:1], -query])
    # the query against itself: each of its rows finds itself (1), so the sum is its row count
    assert scores[0] == pytest.approx(6.0, abs=1e-5)
    np.testing.assert_allclose(scores[1], (query @ query[0]).sum(), rtol=1e-5)
    np.testing.assert_allclose(scores[2], _reference(query, [-query])[0], rtol=1e-5)


def test_documents_or_a_query_without_token_vectors_score_zero():
    rng = np.random.default_rng(3)
    query, full = _unit_rows(rng, 4, 8), _unit_rows(rng, 5, 8)
    empty = np.zeros((0, 8), np.float32)
    scores = maxsim(query, [empty, full, empty])
    assert scores[0] == 0 and scores[2] == 0
    np.testing.assert_allclose(scores[1], _reference(query, [full])[0], rtol=1e-5)
    assert maxsim(query, [empty, empty]).tolist() == [0.0, 0.0]
    assert maxsim(np.zeros((0, 8), np.float32), [full]).tolist() == [0.0]
    assert maxsim(query, []).shape == (0,)


def test_ranking_is_best_first_ties_keep_the_documents_order_and_top_n_cuts():
    rng = np.random.default_rng(4)
    query, a, b = _unit_rows(rng, 3, 8), _unit_rows(rng, 4, 8), _unit_rows(rng, 2, 8)
    documents = [b, a, b, query, a]  # equal documents score alike, to the bit
    scores = maxsim(query, documents)
    assert scores[0] == scores[2] and scores[1] == scores[4]
    indices, best = ranked(scores, None)
    assert indices.dtype == np.int32 and best.dtype == np.float32
    assert indices[0] == 3  # the query itself
    assert indices.tolist() == sorted(range(5), key=lambda i: (-scores[i], i))
    np.testing.assert_array_equal(best, scores[indices])
    top, top_scores = ranked(scores, 2)
    assert top.tolist() == indices[:2].tolist() and top_scores.tolist() == best[:2].tolist()
    assert ranked(scores, 10)[0].tolist() == indices.tolist()  # more than there are: all of them
    assert ranked(np.zeros(0, np.float32), 3)[0].shape == (0,)


@pytest.mark.parametrize(
    ("worker", "late"),
    [
        ({"outputs": "multivector"}, True),  # ColBERT-style, ColQwen2
        ({"outputs": "multivector", "inputs": "text,image"}, True),
        ({"outputs": "dense,sparse,multivector"}, False),  # BGE-M3: dense vectors, a scorer's cosine
        ({"outputs": "dense"}, False),
        ({"outputs": "sparse"}, False),
        ({"task": "score", "dim": "1"}, False),  # a cross-encoder
        ({}, False),  # an older worker that said nothing: dense
    ],
)
def test_which_models_rank_by_maxsim(worker, late):
    assert by_maxsim(worker) is late


def _png(side: int = 8) -> str:
    return data_uri(encoded(Image.new("RGB", (side, side), (200, 10, 10))))


def _body(documents: list, **extra) -> bytes:
    return orjson.dumps({"query": "q", "documents": documents, **extra})


def test_image_documents_are_held_beside_the_texts_in_order():
    call = parse_cohere(_body(["a", {"image": _png()}, {"text": "b"}, {"image": _png(9)}]), LIMITS)
    assert call.texts == ["a", "b"] and call.image_rows == (1, 3) and call.count == 4
    assert call.images is not None and [f[:8] for f in call.images] == [b"\x89PNG\r\n\x1a\n"] * 2
    assert call.documents() == ["a", None, "b", None]
    plain = parse_cohere(_body(["a", {"text": "b"}]), LIMITS)
    assert plain.images is None and plain.image_rows == () and plain.documents() == ["a", "b"]


def test_return_documents_sends_back_texts_only():
    call = parse_cohere(_body([{"image": _png()}, "a text"], return_documents=True), LIMITS)
    answer = orjson.loads(render_cohere(call, "m", "id", np.array([1, 0]), np.array([2.5, 1.0], np.float32)))
    assert answer["results"] == [
        {"index": 1, "relevance_score": 2.5, "document": {"text": "a text"}},
        {"index": 0, "relevance_score": 1.0},
    ]


@pytest.mark.parametrize(
    ("documents", "code", "says"),
    [
        (["a", {"image": "data:image/png;base64,AAAA"}], ErrorCode.INVALID_REQUEST, "'documents[1]': "),
        (["a", {"image": "https://example.com/a.png"}], ErrorCode.INVALID_REQUEST, "'documents[1]': "),
        (
            [{"text": "a", "image": "x"}],
            ErrorCode.INVALID_REQUEST,
            "'documents[0]' must be an object with 'text' or 'image', not both",
        ),
        (["a", "b", "c", {"image": "x"}, "d"], ErrorCode.TOO_MANY_INPUTS, "'documents' has 5 items; the limit is 4"),
        (
            [{"image": "x"}, "far more than twenty characters"],
            ErrorCode.INPUT_TOO_LONG,
            "'documents[1]' has 31 characters",
        ),
    ],
    ids=["undecodable", "a-url", "text-and-image", "images-count", "text-index-kept"],
)
def test_image_documents_refused_as_parsed(documents, code, says):
    with pytest.raises(ApiError) as refused:
        parse_cohere(_body(documents), LIMITS)
    assert refused.value.code is code and refused.value.param == "documents"
    assert refused.value.message.startswith(says), refused.value.message


def test_a_model_that_ranks_texts_refuses_image_documents_naming_the_first():
    call = RerankCall(None, "q", ["a"], None, False, True, False, images=[b"x", b"y"], image_rows=(1, 2))
    with pytest.raises(ApiError) as refused:
        texts_only(call, "colbert")
    assert refused.value.code is ErrorCode.INVALID_REQUEST and refused.value.param == "documents"
    assert refused.value.message.startswith("'documents[1]' is an image, and colbert ranks texts only")
    texts_only(RerankCall(None, "q", ["a"], None, False, True, False), "colbert")  # texts: no error
