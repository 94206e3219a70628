"""/v1/models entries from the metadata tokenizers and workers register."""

from __future__ import annotations

import pytest

from embedfleet.services.gateway.openai.models import model_card, model_kind, render_models


@pytest.mark.parametrize(
    "task, dim, outputs, kind",
    [
        ("embed", 384, ["dense"], "embedding"),
        ("embed", 1024, ["dense", "sparse", "multivector"], "embedding"),  # BGE-M3
        ("embed", 128, ["multivector"], "multivector"),  # ColBERT: /v1/embeddings refuses it
        ("embed", 30522, ["sparse"], "sparse"),
        ("embed", 30522, ["sparse", "multivector"], "sparse"),  # no dense vector: /embed_sparse serves it
        ("score", 1, ["dense"], "rerank"),
        ("score", 3, ["dense"], "classify"),
    ],
)
def test_kind(task, dim, outputs, kind):
    assert model_kind(task, dim, outputs) == kind


def test_card_keeps_openai_fields_and_adds_the_model_facts():
    tokenizer = {
        "model": "m",
        "max_seq_length": "512",
        "prompts": "document,query",
        "tasks": "retrieval.query,text-matching",
        "dim": "768",
    }
    worker = {"model": "m", "dim": "768", "task": "embed", "outputs": "dense,sparse"}
    assert model_card("m", tokenizer, worker, True) == {
        "id": "m",
        "object": "model",
        "created": 0,
        "owned_by": "embedfleet",
        "kind": "embedding",
        "dimensions": 768,
        "max_tokens": 512,
        "outputs": ["dense", "sparse"],
        "inputs": ["text"],
        "prompts": ["document", "query"],
        "tasks": ["retrieval.query", "text-matching"],
        "default": True,
    }
    two_towers = model_card("c", tokenizer, {**worker, "inputs": "text,image"}, False)
    assert two_towers["inputs"] == ["text", "image"]


def test_card_of_a_process_that_says_little():
    card = model_card("old", {"max_seq_length": "n/a"}, {}, False)
    assert (card["kind"], card["dimensions"], card["max_tokens"], card["outputs"], card["prompts"]) == (
        "embedding",
        None,
        None,
        ["dense"],
        [],
    )


def test_list_marks_one_default():
    meta = {"a": {"dim": "1", "task": "score"}, "b": {"dim": "8"}}
    body = render_models(["a", "b"], {}, meta, "b")
    assert body["object"] == "list"
    assert [(m["id"], m["kind"], m["default"]) for m in body["data"]] == [
        ("a", "rerank", False),
        ("b", "embedding", True),
    ]


def test_a_classifier_lists_its_labels():
    worker = {"dim": "3", "task": "score", "labels": '["entailment", "neutral", "contradiction, or not"]'}
    card = model_card("nli", {}, worker, False)
    assert (card["kind"], card["dimensions"]) == ("classify", 3)
    assert card["labels"] == ["entailment", "neutral", "contradiction, or not"]
    assert "labels" not in model_card("nli", {}, {**worker, "labels": "not json"}, False)
    assert "labels" not in model_card("ce", {}, {"dim": "1", "task": "score", "labels": '["LABEL_0"]'}, False)


def test_the_list_says_what_search_reads_only_when_it_is_served():
    workers = {"m": {"dim": "384"}}
    assert "search" not in render_models(["m"], {"m": {}}, workers, "m")
    card = {"route": "/v1/search", "store": "postgresql", "table": "t", "model": None}
    listed = render_models(["m"], {"m": {}}, workers, "m", card)
    assert listed["search"] == card and [d["id"] for d in listed["data"]] == ["m"]
