"""What the TEI routes answer, as typed models: /embed, /embed_sparse, /embed_all, /tokenize, /rerank,
/predict, /similarity, /decode, POST / (and /invocations) and GET /info.

Shapes are text-embeddings-inference's (router/src/http/types.rs), with embedfleet's extensions (chunk
rows, quantized forms). /openapi.json's 200 schemas are generated from these models and the tests hold
the renderers' bytes to them (api.py, tasks.py, rerank_api.render_tei); the routes write their
answers with orjson, never through a model. Most answers are bare JSON arrays, hence the root models;
their names start with Tei, as components.schemas holds every family's models under one namespace.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, RootModel

from embedfleet.services.gateway.response_parts import ANSWER, omitted

# ANSWER for a bare array (a root model takes no ``extra``: what it holds are the models that forbid it)
ROOT = ConfigDict(strict=True)

# a row as JSON numbers: floats for float32 / float16, integers for int8, uint8 and the packed bytes of
# binary / ubinary (embedding_type)
Vector = list[float]


class TeiEmbedChunk(BaseModel):
    """One chunk of an input and its row (``chunking`` with ``"return": "chunks"``): inputs[i][start:end]
    is its text."""

    model_config = ANSWER

    chunk: int = Field(description="the chunk's number within its input")
    start: int = Field(description="the chunk's first character")
    end: int = Field(description="past the chunk's last character")
    embedding: Vector


class TeiEmbedAnswer(RootModel[list[Vector] | list[list[TeiEmbedChunk]]]):
    """/embed: a vector per input; with chunking return 'chunks' (an extension), per input its chunks."""

    model_config = ROOT

    root: (
        Annotated[list[Vector], Field(description="a vector per input")]
        | Annotated[
            list[list[TeiEmbedChunk]],
            Field(description="an extension, with chunking return 'chunks': per input its chunks"),
        ]
    )


class TeiSparseValue(BaseModel):
    model_config = ANSWER

    index: int = Field(description="the vocabulary entry (token ID)")
    value: float = Field(description="its weight, above zero")


class TeiSparseAnswer(RootModel[list[list[TeiSparseValue]]]):
    """/embed_sparse: per input, its nonzero entries, indices ascending."""

    model_config = ROOT


class TeiAllAnswer(RootModel[list[list[Vector]]]):
    """/embed_all: per input, a vector per token."""

    model_config = ROOT


class TeiToken(BaseModel):
    model_config = ANSWER

    id: int = Field(description="the token ID")
    text: str = Field(description="the token as the vocabulary spells it")
    special: bool = Field(description="an added special token ([CLS], [SEP], ...)")
    start: int | None = Field(description="the token's first character in its input (null for a special token)")
    stop: int | None = Field(description="past the token's last character (null for a special token)")


class TeiTokenizeAnswer(RootModel[list[list[TeiToken]]]):
    """/tokenize: per input, its tokens."""

    model_config = ROOT


class TeiRank(BaseModel):
    model_config = ANSWER

    index: int = Field(description="the text's position in the request's texts")
    score: float = Field(
        description="its relevance to the query: a cross-encoder's sigmoid (its logit with raw_scores), "
        "a bi-encoder's cosine"
    )
    text: str = omitted("the text, with return_text")


class TeiRerankAnswer(RootModel[list[TeiRank]]):
    """/rerank: the texts by relevance, best first (the top_n best with top_n)."""

    model_config = ROOT


class TeiPrediction(BaseModel):
    model_config = ANSWER

    score: float = Field(description="softmax over the labels (sigmoid of one label), or the logit with raw_scores")
    label: str


Predictions = Annotated[list[TeiPrediction], Field(description="per label, best first")]


class TeiPredictAnswer(RootModel[Predictions | list[Predictions]]):
    """/predict: a text's or a pair's label scores; for a batch, per input."""

    model_config = ROOT

    root: Predictions | Annotated[list[Predictions], Field(description="a batch: per input")]


class TeiSimilarityAnswer(RootModel[list[float]]):
    """/similarity: per sentence, its cosine with the source sentence, in [-1, 1]."""

    model_config = ROOT


class TeiDecodeAnswer(RootModel[list[str]]):
    """/decode: per sequence of IDs, its text."""

    model_config = ROOT


class TeiRootAnswer(
    RootModel[TeiEmbedAnswer | TeiSparseAnswer | TeiRerankAnswer | TeiPredictAnswer | TeiSimilarityAnswer]
):
    """POST / (and /invocations): the answer of the task the model's kind runs (embed, embed_sparse, rerank,
    predict) or, for a body with inputs.source_sentence, similarity's. Any of them, not one of them: an
    empty list is each."""

    model_config = ROOT


class TeiPooling(BaseModel):
    model_config = ANSWER

    pooling: str = Field(
        description="how token vectors make a text's, e.g. mean, cls, lasttoken; splade for a sparse-only model"
    )


class TeiEmbeddingKind(BaseModel):
    model_config = ANSWER

    embedding: TeiPooling


class TeiLabels(BaseModel):
    model_config = ANSWER

    id2label: dict[str, str] = Field(description="a logit's index (as a string) to its label")
    label2id: dict[str, int] = Field(description="a label to its logit's index")


class TeiClassifierKind(BaseModel):
    model_config = ANSWER

    classifier: TeiLabels = Field(description="a sequence classifier of several labels (/predict)")


class TeiRerankerKind(BaseModel):
    model_config = ANSWER

    reranker: TeiLabels = Field(description="a one-logit cross-encoder (/rerank)")


class TeiInfo(BaseModel):
    """GET /info: the model and the gateway's limits, as TEI names them."""

    model_config = ANSWER

    model_id: str = Field(description="the served model's name")
    model_sha: str | None = Field(description="its revision: null, which embedfleet does not track")
    model_dtype: str = Field(description="the workers' compute type, e.g. float32, float16")
    model_type: TeiEmbeddingKind | TeiClassifierKind | TeiRerankerKind
    max_concurrent_requests: int = Field(description="requests handled at once (--max-in-flight)")
    max_input_length: int = Field(description="the model's longest input, in tokens")
    max_batch_tokens: int = Field(description="a worker's batch budget, in tokens")
    max_batch_requests: int | None = Field(description="null: batches are capped by tokens")
    max_client_batch_size: int = Field(description="inputs a request may hold (--max-inputs)")
    auto_truncate: bool = Field(description="false: over-long inputs are refused unless truncate is asked")
    tokenization_workers: int | None = Field(description="null: tokenizers are services of their own")
    version: str = Field(description="embedfleet's version")
