"""Which task adapter a request's rows run with, and its prompt (services/tokenizer/tasks.py), for a
Jina v3-like model (an adapter per retrieval side, prompts named by task), a v5-like one (one
retrieval adapter, query / document prompts) and a model without adapters; and the option's wire form."""

from __future__ import annotations

import pytest

from embedfleet.services.tokenizer.tasks import resolve_task
from embedfleet.shared.errors import ServiceError
from embedfleet.shared.protocol import ChunkRequest, EmbedOptions, decode_as, encode
from embedfleet.shared.text_chunks import ChunkSpec

V3 = ("retrieval.query", "retrieval.passage", "separation", "classification", "text-matching")
V3_PROMPTS = {"retrieval.query": "Represent the query: ", "retrieval.passage": "Represent the document: "}
V5 = ("retrieval", "text-matching", "clustering", "classification")
V5_PROMPTS = {"query": "Query: ", "document": "Document: "}


@pytest.mark.parametrize(
    ("task", "prompt_name", "input_type", "want"),
    [
        (None, None, None, (None, None)),  # the base model, as Jina's code with no task
        ("text-matching", None, None, ("text-matching", None)),  # no prompt of that name
        ("retrieval.query", None, None, ("retrieval.query", "retrieval.query")),  # and its prompt
        ("retrieval.query", "retrieval.passage", None, ("retrieval.query", "retrieval.passage")),  # prompt as named
        (None, None, "query", ("retrieval.query", "retrieval.query")),  # OpenAI / TEI input_type
        (None, None, "document", ("retrieval.passage", "retrieval.passage")),
        (None, None, "clustering", ("separation", None)),  # Cohere's input types
        (None, None, "classification", ("classification", None)),
        (None, "retrieval.passage", None, ("retrieval.passage", "retrieval.passage")),  # TEI prompt_name
    ],
)
def test_v3_tasks(task, prompt_name, input_type, want):
    assert resolve_task(V3, V3_PROMPTS, task, prompt_name, input_type) == want


@pytest.mark.parametrize(
    ("task", "prompt_name", "input_type", "want"),
    [
        (None, None, "query", ("retrieval", None)),  # the input type's own prompt follows (Query: )
        (None, None, "clustering", ("clustering", None)),
        ("retrieval.passage", None, None, ("retrieval", "document")),  # Jina's v3 names on v5
        ("retrieval", None, "document", ("retrieval", None)),
        (None, "query", None, ("retrieval", "query")),
    ],
)
def test_v5_tasks(task, prompt_name, input_type, want):
    assert resolve_task(V5, V5_PROMPTS, task, prompt_name, input_type) == want


def test_a_task_the_model_lacks_is_refused_naming_those_it_has():
    with pytest.raises(ServiceError, match=r"no task 'summarize' \(its tasks: retrieval.query, retrieval.passage, "):
        resolve_task(V3, V3_PROMPTS, "summarize", None, None)
    with pytest.raises(ServiceError, match="its tasks: none: it has no task adapters"):
        resolve_task((), {"query": "q: "}, "retrieval.query", None, None)


def test_an_adapters_own_prompt_wins_over_the_input_types():
    prompts = {**V3_PROMPTS, "query": "", "document": ""}
    assert resolve_task(V3, prompts, None, None, "query") == ("retrieval.query", "retrieval.query")


def test_a_model_without_adapters_keeps_its_prompts():
    assert resolve_task((), {"query": "q: "}, None, None, "query") == (None, None)
    assert resolve_task((), {"query": "q: "}, None, "query", None) == (None, "query")


def test_the_task_travels_in_embed_options_and_chunk_requests():
    options = EmbedOptions(task="retrieval.query", input_type="query")
    assert EmbedOptions.from_wire(options.to_wire()) == options
    assert "tk" not in EmbedOptions().to_wire()  # absent when none: older peers read the same map
    request = ChunkRequest("a" * 32, "m", ["text"], ChunkSpec(8), task="text-matching")
    assert decode_as(encode(request), ChunkRequest).task == "text-matching"
    with pytest.raises(Exception, match="task must be a short string"):
        EmbedOptions(task="x" * 300)
