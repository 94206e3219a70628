"""The bodies of TEI's task routes (/predict, /similarity, /decode, /rerank) as typed models: each
validates a request and is the route's request schema in /openapi.json.

Shapes are text-embeddings-inference's (router/src/http/types.rs: ``PredictRequest``,
``SimilarityRequest``, ``DecodeRequest``, ``RerankRequest``), with the extension ``model``. As for the
embedding routes (body.py): unknown fields ignored, a null optional field as if absent, strict
types; limits and the model's kind are checked in tasks.py after validation.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Discriminator, Field

from embedfleet.services.gateway.http.body_errors import member
from embedfleet.services.gateway.openai.body import TokenIds
from embedfleet.services.gateway.tei.body import Direction, Model, PromptName, TeiBody, Truncate

RawScores = Annotated[bool | None, Field(description="logits instead of softmax over labels (sigmoid of one)")]
# one text, or a text and the text it is paired with (a cross-encoder's query and passage)
Sequence = Annotated[list[str], Field(min_length=1, max_length=2)]


def _predict_kind(value: Any) -> str | None:
    """Which form ``inputs`` is in: a batch is a list of lists, as TEI tells them apart."""
    if isinstance(value, list):
        return "<batch>" if value and isinstance(value[0], list) else "<pair>"
    return "<text>" if isinstance(value, str) else None


PredictInputs = Annotated[
    Annotated[str, member("text")]
    | Annotated[Sequence, member("pair"), Field(description="[text] or [text, text_pair]")]
    | Annotated[
        list[Sequence], member("batch"), Field(min_length=1, description="a batch of [text] / [text, text_pair]")
    ],
    Discriminator(_predict_kind),
    Field(description="a text, a [text, text_pair] pair, or a batch of [text] and [text, text_pair] lists"),
]


class PredictBody(TeiBody):
    """A sequence classifier's label scores (TEI)."""

    inputs: PredictInputs
    raw_scores: RawScores = False
    truncate: Truncate = False
    truncation_direction: Direction | None = "right"
    model: Model = None


class SimilarityInputs(TeiBody):
    source_sentence: str = Field(description="the sentence the others are compared with")
    sentences: list[str] = Field(min_length=1, description="each answered with its cosine to the source sentence")


class SimilarityParameters(TeiBody):
    truncate: Truncate = False
    truncation_direction: Direction | None = "right"
    prompt_name: PromptName = None


class SimilarityBody(TeiBody):
    """Cosine similarity of sentences to a source sentence (TEI; huggingface_hub's sentence_similarity)."""

    inputs: SimilarityInputs
    parameters: SimilarityParameters | None = None
    model: Model = None


def _ids_kind(value: Any) -> str | None:
    """Which form ``ids`` is in, told by its first item (an empty list: token IDs, refused as empty)."""
    if isinstance(value, list):
        first = value[0] if value else 0
        if isinstance(first, int) and not isinstance(first, bool):
            return "<tokens>"
        if isinstance(first, list):
            return "<token_lists>"
    return None


Ids = Annotated[
    Annotated[TokenIds, member("tokens")] | Annotated[list[TokenIds], member("token_lists"), Field(min_length=1)],
    Discriminator(
        _ids_kind,
        custom_error_type="ids_form",
        custom_error_message="Input should be a list of token IDs or a list of token-ID lists",
    ),
    Field(description="a list of token IDs, or a list of token-ID lists"),
]


class DecodeBody(TeiBody):
    """Token IDs back to text (TEI)."""

    ids: Ids
    skip_special_tokens: bool | None = Field(True, description="leave the model's special tokens out")
    model: Model = None


class RerankBody(TeiBody):
    """Rerank texts by relevance to a query (TEI)."""

    query: str = Field(min_length=1)
    texts: list[str] = Field(description="may be empty: the answer is an empty ranking")
    raw_scores: RawScores = False
    return_text: bool | None = Field(False, description="each result carries its text")
    truncate: Truncate = False
    top_n: Annotated[int, Field(ge=1)] | None = Field(None, description="an extension: only the n best")
    model: Model = None
