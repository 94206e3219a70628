"""TEI's /predict, /similarity, /decode shapes and the task POST / runs (no I/O: parsing and rendering)."""

from __future__ import annotations

import json
import math

import numpy as np
import orjson
import pytest

from embedfleet.services.gateway.http.errors import ApiError, error_response
from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.tei.api import render_info
from embedfleet.services.gateway.tei.tasks import (
    label_scores,
    model_type,
    parse_decode,
    parse_predict,
    parse_similarity,
    render_predict,
    render_similarity,
    root_task,
    worker_labels,
)
from embedfleet.shared.errors import ErrorCode

LIMITS = Limits(max_inputs=4, max_input_chars=50)
CLASSIFIER = {"task": "score", "dim": "3", "labels": json.dumps(["negative", "neutral", "positive"])}
RERANKER = {"task": "score", "dim": "1"}


def _predict(doc: dict):
    return parse_predict(orjson.dumps(doc), LIMITS)


def test_predict_inputs_are_a_text_a_pair_or_a_batch_of_them():
    one = _predict({"inputs": "great film"})
    assert (one.inputs, one.batch, one.raw_scores, one.truncate) == (["great film"], False, False, False)
    assert _predict({"inputs": ["only text"]}).inputs == ["only text"]
    pair = _predict({"inputs": ["a question", "an answer"], "raw_scores": True})
    assert (pair.inputs, pair.batch, pair.raw_scores) == ([("a question", "an answer")], False, True)
    batch = _predict({"inputs": [["x"], ["q", "d"]], "truncate": True, "truncation_direction": "Left"})
    assert (batch.inputs, batch.batch) == (["x", ("q", "d")], True)
    assert (batch.options.truncate, batch.options.truncation_direction, batch.options.normalize) == (
        True,
        "left",
        False,
    )


@pytest.mark.parametrize(
    "doc, status, fragment",
    [
        ({}, 400, "'inputs' is required"),
        ({"inputs": []}, 400, "must be a string, a pair of strings"),
        ({"inputs": ["a", "b", "c"]}, 400, "must be a string, a pair of strings"),
        ({"inputs": [["a"], "b"]}, 400, "'inputs[1]' must be"),  # a batch holds lists only, as TEI's
        ({"inputs": [["a", "b", "c"]]}, 400, "'inputs[0]' must be"),
        ({"inputs": [[]]}, 400, "'inputs[0]' must be"),
        ({"inputs": 7}, 400, "must be a string"),
        ({"inputs": ["a", 7]}, 400, "must be a string"),
        ({"inputs": [["a"]] * 5}, 422, "the limit is 4"),
        ({"inputs": ["q", "x" * 51]}, 413, "51 characters"),
        ({"inputs": "a", "raw_scores": "yes"}, 400, "'raw_scores' must be true or false, got 'yes'"),
        ({"inputs": "a", "truncation_direction": "up"}, 400, "'Right' or 'Left'"),
    ],
)
def test_predict_refusals(doc, status, fragment):
    with pytest.raises(ApiError) as err:
        _predict(doc)
    assert err.value.status == status and fragment in err.value.message


def test_label_scores_softmax_over_labels_sigmoid_of_one():
    logits = np.array([[2.0, -1.0, 0.5], [0.0, 0.0, 0.0]], np.float32)
    row = [math.exp(x) for x in (2.0, -1.0, 0.5)]
    np.testing.assert_allclose(label_scores(logits, False)[0], [x / sum(row) for x in row], rtol=1e-12)
    np.testing.assert_allclose(label_scores(logits, False)[1], [1 / 3] * 3, rtol=1e-12)
    np.testing.assert_allclose(
        label_scores(np.array([[0.3]], np.float32), False), [[1 / (1 + math.exp(-0.3))]], rtol=1e-6
    )
    np.testing.assert_array_equal(label_scores(logits, True), logits.astype(np.float64))
    huge = label_scores(np.array([[1000.0, 0.0]], np.float32), False)  # no overflow
    np.testing.assert_allclose(huge, [[1.0, 0.0]])


def test_predictions_are_sorted_best_first_per_input():
    scores = np.array([[0.2, 0.7, 0.1], [0.5, 0.1, 0.4]])
    labels = worker_labels(CLASSIFIER)
    single = orjson.loads(render_predict(_predict({"inputs": "a"}), scores[:1], labels))
    assert single == [
        {"score": 0.7, "label": "neutral"},
        {"score": 0.2, "label": "negative"},
        {"score": 0.1, "label": "positive"},
    ]
    batch = orjson.loads(render_predict(_predict({"inputs": [["a"], ["b"]]}), scores, labels))
    assert [[p["label"] for p in row] for row in batch] == [
        ["neutral", "negative", "positive"],
        ["negative", "positive", "neutral"],
    ]
    with pytest.raises(ApiError, match="NaN"):
        render_predict(_predict({"inputs": "a"}), np.array([[np.nan, 0.1, 0.2]]), labels)
    with pytest.raises(ApiError, match="2 scores for 3 labels"):
        render_predict(_predict({"inputs": "a"}), np.array([[0.1, 0.2]]), labels)


def test_label_names_come_from_the_worker_or_default_as_transformers():
    assert worker_labels(CLASSIFIER) == ["negative", "neutral", "positive"]
    assert worker_labels(RERANKER) == ["LABEL_0"]
    assert worker_labels({"task": "score", "dim": "2", "labels": "not json"}) == ["LABEL_0", "LABEL_1"]
    assert worker_labels({"task": "score", "dim": "2", "labels": '["only one"]'}) == ["LABEL_0", "LABEL_1"]


def test_similarity_body_and_cosines():
    call = parse_similarity(
        orjson.dumps(
            {
                "inputs": {"source_sentence": "s", "sentences": ["a", "b"]},
                "parameters": {"truncate": True, "prompt_name": "query"},
            }
        ),
        LIMITS,
    )
    assert call.inputs.texts == ["s", "a", "b"]
    assert (call.options.truncate, call.options.prompt_name, call.options.output) == (True, "query", "dense")
    plain = parse_similarity(
        orjson.dumps({"inputs": {"source_sentence": "s", "sentences": ["a"]}, "parameters": None}), LIMITS
    )
    assert (plain.options.truncate, plain.options.prompt_name) == (False, None)  # TEI's defaults
    rng = np.random.default_rng(0)
    v = rng.standard_normal((4, 8)).astype(np.float32)
    want = [float(np.dot(v[0], v[i]) / (np.linalg.norm(v[0]) * np.linalg.norm(v[i]))) for i in (1, 2, 3)]
    np.testing.assert_allclose(orjson.loads(render_similarity(v)), want, rtol=1e-6)
    assert orjson.loads(render_similarity(np.array([[1.0, 0.0], [0.0, 0.0]], np.float32))) == [0.0]


@pytest.mark.parametrize(
    "doc, status, fragment",
    [
        ({"inputs": "s"}, 400, "'inputs' must be an object"),
        ({"inputs": {"sentences": ["a"]}}, 400, "'inputs.source_sentence' is required"),
        ({"inputs": {"source_sentence": "s", "sentences": []}}, 400, "'inputs.sentences' must not be an empty list"),
        ({"inputs": {"source_sentence": 3, "sentences": ["a"]}}, 400, "'inputs.source_sentence' must be a string"),
        ({"inputs": {"source_sentence": "s", "sentences": "a"}}, 400, "'inputs.sentences' must be a list, got 'a'"),
        ({"inputs": {"source_sentence": "s", "sentences": [1]}}, 400, "'inputs.sentences[0]' must be a string"),
        (
            {"inputs": {"source_sentence": "s", "sentences": ["a"] * 4}},
            422,
            "5 inputs with the source sentence; the limit is 4",
        ),
        ({"inputs": {"source_sentence": "s", "sentences": ["x" * 51]}}, 413, "51 characters"),
        ({"inputs": {"source_sentence": "x" * 51, "sentences": ["a"]}}, 413, "51 characters"),
        (
            {"inputs": {"source_sentence": "s", "sentences": ["a"]}, "parameters": []},
            400,
            "'parameters' must be an object",
        ),
        (
            {"inputs": {"source_sentence": "s", "sentences": ["a"]}, "parameters": {"truncate": 1}},
            400,
            "'parameters.truncate' must be true or false, got 1",
        ),
    ],
)
def test_similarity_refusals(doc, status, fragment):
    with pytest.raises(ApiError) as err:
        parse_similarity(orjson.dumps(doc), LIMITS)
    assert err.value.status == status and fragment in err.value.message


def test_decode_takes_one_sequence_or_a_batch():
    one = parse_decode(orjson.dumps({"ids": [101, 7592, 102]}), LIMITS)
    assert [ids.tolist() for ids in one.ids] == [[101, 7592, 102]] and one.skip_special_tokens is True
    batch = parse_decode(orjson.dumps({"ids": [[101], [7592, 2088]], "skip_special_tokens": False}), LIMITS)
    assert [ids.tolist() for ids in batch.ids] == [[101], [7592, 2088]] and batch.skip_special_tokens is False
    assert batch.ids[0].dtype == np.int32


@pytest.mark.parametrize(
    "doc, status, fragment",
    [
        ({}, 400, "'ids' is required"),
        ({"ids": []}, 400, "must not be an empty list"),
        ({"ids": [[]]}, 400, "non-empty list of token IDs"),
        ({"ids": "101"}, 400, "got string"),
        ({"ids": ["hello"]}, 400, "got a list of strings"),
        ({"ids": [True]}, 400, "got a list of booleans"),
        ({"ids": [101, -1]}, 422, "not a token ID"),
        ({"ids": [101, 2**31]}, 422, "not a token ID"),
        ({"ids": [[101], 7]}, 400, "'ids[1]' must be a non-empty list"),
        ({"ids": [[1]] * 5}, 422, "the limit is 4"),
        ({"ids": [1], "skip_special_tokens": "no"}, 400, "'skip_special_tokens' must be true or false, got 'no'"),
    ],
)
def test_decode_refusals(doc, status, fragment):
    with pytest.raises(ApiError) as err:
        parse_decode(orjson.dumps(doc), LIMITS)
    assert err.value.status == status and fragment in err.value.message


@pytest.mark.parametrize(
    "doc, worker, task",
    [
        ({"inputs": "a"}, {"task": "embed", "outputs": "dense"}, "embed"),
        ({"inputs": "a"}, {}, "embed"),  # a worker from before outputs were registered
        ({"inputs": "a"}, {"task": "embed", "outputs": "dense,sparse,multivector"}, "embed"),  # BGE-M3: dense first
        ({"inputs": "a"}, {"task": "embed", "outputs": "sparse"}, "embed_sparse"),  # SPLADE
        ({"inputs": {"source_sentence": "s", "sentences": ["a"]}}, {"task": "embed", "outputs": "dense"}, "similarity"),
        ({"inputs": {"source_sentence": "s", "sentences": ["a"]}}, CLASSIFIER, "similarity"),
        ({"inputs": "a"}, CLASSIFIER, "predict"),
        ({"query": "q", "texts": ["a"]}, CLASSIFIER, "predict"),  # TEI mounts predict on / for a classifier
        ({"query": "q", "texts": ["a"]}, RERANKER, "rerank"),
        ({}, RERANKER, "rerank"),
        ({"inputs": ["q", "d"]}, RERANKER, "predict"),
    ],
)
def test_root_runs_the_task_of_the_model_kind(doc, worker, task):
    assert root_task(doc, worker) == task


def test_info_names_the_model_type_as_tei():
    def info(worker: dict) -> dict:
        return orjson.loads(render_info("m", {"pooling": "mean"}, worker, LIMITS, 8, "0"))["model_type"]

    assert info(CLASSIFIER) == {
        "classifier": {
            "id2label": {"0": "negative", "1": "neutral", "2": "positive"},
            "label2id": {"negative": 0, "neutral": 1, "positive": 2},
        }
    }
    assert info(RERANKER) == {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    assert info({"task": "embed", "outputs": "sparse", "pooling": "max"}) == {"embedding": {"pooling": "splade"}}
    assert info({"task": "embed", "outputs": "dense", "pooling": "cls"}) == {"embedding": {"pooling": "cls"}}
    assert model_type({}, {"pooling": "mean"}) == {"embedding": {"pooling": "mean"}}


@pytest.mark.parametrize("path", ["/predict", "/similarity", "/decode", "/", "/invocations", "/ping"])
def test_new_routes_answer_errors_in_tei_shape(path):
    r = error_response(path, ErrorCode.INVALID_REQUEST, "bad")
    assert orjson.loads(r.body) == {"error": "bad", "error_type": "Validation"}


def test_similarity_cosines_stay_within_minus_one_and_one():
    """A sentence equal to the source (or its negation) may round past 1 (-1) in float64: clipped."""
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((2000, 384)).astype(np.float32)
    got = np.array([orjson.loads(render_similarity(np.stack([r, r, -r]))) for r in rows])
    assert got.max() == 1.0 and got.min() == -1.0
    np.testing.assert_allclose(got, np.tile([1.0, -1.0], (len(rows), 1)), atol=1e-12)


def test_decode_ids_outside_the_vocabulary_are_named():
    from embedfleet.services.gateway.tei.tasks import check_vocabulary

    check_vocabulary([np.array([0, 5, 9], dtype=np.int32)], 10)
    with pytest.raises(ApiError) as caught:
        check_vocabulary([np.array([1, 2], dtype=np.int32), np.array([3, 10, 11], dtype=np.int32)], 10)
    assert caught.value.code == ErrorCode.INVALID_TOKENS and caught.value.status == 422
    assert caught.value.message == "token id 10 (ids[1][1]) is outside the vocabulary of 10 ids [0, 10)"
