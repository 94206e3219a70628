"""What the OpenAI routes answer, as typed models: POST /v1/embeddings (and /embeddings) in JSON, and
GET /v1/models.

/openapi.json's 200 schemas of those routes are generated from these models, and the tests hold the
bytes the routes write (openai_api.render_embeddings, models_api.render_models) to them; the routes
themselves write with orjson (response_parts.py says why).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from embedfleet.services.gateway.response_parts import ANSWER, ChunkPlace, Row, omitted


class OpenAIUsage(BaseModel):
    model_config = ANSWER

    prompt_tokens: int = Field(description="the tokens embedded, special tokens included (chunked: every chunk's)")
    total_tokens: int = Field(description="the same: embedding reads no other tokens")


class OpenAIEmbedding(BaseModel):
    """A row per input (``chunking`` with ``"return": "mean"`` included: its chunks' mean)."""

    model_config = ANSWER

    object: Literal["embedding"]
    index: int = Field(description="the input")
    embedding: Row


class OpenAIChunkEmbedding(ChunkPlace):
    """A row per chunk (``chunking`` with ``"return": "chunks"``), where the chunk lies in its input."""

    object: Literal["embedding"]
    embedding: Row


class OpenAIEmbeddings(BaseModel):
    """POST /v1/embeddings' JSON answer: the rows in the request's embedding_type and encoding_format."""

    model_config = ANSWER

    object: Literal["list"]
    data: list[OpenAIEmbedding] | list[OpenAIChunkEmbedding] = Field(
        description="the rows in input order (chunked: each input's chunks in order)"
    )
    model: str = Field(description="the served model that answered")
    usage: OpenAIUsage


class SearchCard(BaseModel):
    """What GET /v1/models says of POST /v1/search, when the gateway serves it (--search-sink)."""

    model_config = ANSWER

    route: str = Field(description="the search route")
    store: str = Field(
        description="the kind of store, its URL's scheme (postgresql, lancedb, qdrant): nothing of its address, "
        "user or path, which any key may read here"
    )
    table: str = Field(description="the table (Qdrant: collection) a search naming none reads")
    model: str | None = Field(
        description="--search-model: the model whose vectors the store holds (null: each request names it)"
    )


class ModelCard(BaseModel):
    """A served model: OpenAI's fields, then what it does and its limits, as its live processes register."""

    model_config = ANSWER

    id: str
    object: Literal["model"]
    created: int = Field(description="always 0: a served model has no creation time")
    owned_by: str
    kind: Literal["embedding", "sparse", "multivector", "rerank", "classify"] = Field(
        description="what the model serves: embeddings (dense vectors, /v1/embeddings), sparse vectors without "
        "dense ones, token vectors only (ColBERT, /embed_all), reranking (one label), classifying"
    )
    dimensions: int | None = Field(
        description="a vector's length: the vocabulary for sparse, the number of labels for rerank / classify "
        "(null: its worker did not say)"
    )
    max_tokens: int | None = Field(
        description="the longest input in tokens, special tokens included (null: its tokenizer did not say)"
    )
    outputs: list[str] = Field(description="the outputs its workers make, e.g. dense, sparse, multivector")
    inputs: list[Literal["text", "image"]] = Field(
        description="what it embeds: text, and image for a two-tower model (CLIP)"
    )
    prompts: list[str] = Field(description="prompt names a request's input_type / prompt_name may choose")
    tasks: list[str] = Field(
        description="the task adapters a request's task may choose (jina-embeddings-v3: retrieval.query, ...); "
        "empty for a model without them"
    )
    default: bool = Field(description="the model of requests that name none")
    labels: list[str] = omitted("a classifier's label names, by logit")


class ModelList(BaseModel):
    """GET /v1/models: the models the fleet serves right now."""

    model_config = ANSWER

    object: Literal["list"]
    data: list[ModelCard]
    search: SearchCard = omitted("the search route, when the gateway serves one (--search-sink)")
