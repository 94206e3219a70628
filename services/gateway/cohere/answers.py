"""What the Cohere routes answer, as typed models: POST /v1/embed, /v2/embed, /v2/rerank, and POST
/v1/rerank (Cohere v1's and Jina's rerank shape).

/openapi.json's 200 schemas of those routes are generated from these models, and the tests hold the
bytes the routes write (cohere_api.render_embed, cohere_api.render_rerank, rerank_api.render_cohere)
to them; the routes themselves write with orjson (response_parts.py says why).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, RootModel

from embedfleet.services.gateway.response_parts import ANSWER, ChunkPlace, omitted

# rows of float32 components (a name of its own: the field named float would hide the type in its class)
FloatRows = list[list[float]]
# rows of the forms that are bytes: int8 and uint8 components, binary and ubinary packed 8 per byte
IntRows = list[list[int]]
_SCORE = (
    "higher is more relevant: a cross-encoder's score as CrossEncoder.predict gives it, a bi-encoder's cosine, "
    "a multi-vector model's MaxSim sum"
)


class CohereApiVersion(BaseModel):
    model_config = ANSWER

    version: str = Field(description="the API's version the route speaks: '1' or '2'")


class CohereBilledUnits(BaseModel):
    model_config = ANSWER

    input_tokens: int = Field(description="the tokens embedded, special tokens included (chunked: every chunk's)")


class CohereEmbedMeta(BaseModel):
    model_config = ANSWER

    api_version: CohereApiVersion
    billed_units: CohereBilledUnits


class CohereEmbeddingsByType(BaseModel):
    """The rows in each type asked for (embedding_types), each once, in the order asked; every type's
    rows are aligned (one a text, or one a chunk)."""

    model_config = ANSWER

    float: FloatRows = omitted("float32 rows as JSON numbers")
    int8: IntRows = omitted("int8 components")
    uint8: IntRows = omitted("uint8 components")
    binary: IntRows = omitted("sign bits packed 8 per byte, as int8: ceil(dim / 8) a row")
    ubinary: IntRows = omitted("sign bits packed 8 per byte, as uint8: ceil(dim / 8) a row")
    base64: list[str] = omitted("each float32 row's little-endian bytes, base64-encoded")


class CohereEmbedFloats(BaseModel):
    """v1's answer to a request that names no embedding_types."""

    model_config = ANSWER

    id: str = Field(description="the request's id")
    response_type: Literal["embeddings_floats"]
    embeddings: FloatRows = Field(description="a float32 row per text")
    texts: list[str] = Field(description="the texts embedded")
    meta: CohereEmbedMeta


class CohereEmbedByType(BaseModel):
    """v2's answer, and v1's to a request that names embedding_types."""

    model_config = ANSWER

    id: str = Field(description="the request's id")
    response_type: Literal["embeddings_by_type"]
    embeddings: CohereEmbeddingsByType
    texts: list[str] = Field(description="the texts embedded (v2's inputs: their text items)")
    meta: CohereEmbedMeta
    chunks: list[ChunkPlace] = omitted(
        "an extension, with v2's chunking (return 'chunks'): where each row of every type lies"
    )


class CohereEmbedV1Answer(RootModel[CohereEmbedFloats | CohereEmbedByType]):
    """POST /v1/embed: plain float rows, or rows by type when the request names embedding_types."""

    root: Annotated[CohereEmbedFloats | CohereEmbedByType, Field(discriminator="response_type")]


class CohereRerankMeta(BaseModel):
    model_config = ANSWER

    api_version: CohereApiVersion


class CohereRerankResult(BaseModel):
    model_config = ANSWER

    index: int = Field(description="the document's position in the request's documents")
    relevance_score: float = Field(description=_SCORE)


class CohereRerankV2Answer(BaseModel):
    """POST /v2/rerank: the documents best first (top_n of them, if sent)."""

    model_config = ANSWER

    id: str = Field(description="the request's id")
    results: list[CohereRerankResult]
    meta: CohereRerankMeta


class RerankDocument(BaseModel):
    model_config = ANSWER

    text: str


class RerankV1Result(CohereRerankResult):
    """/v1/rerank's result: v2's, and the document's text with return_documents."""

    document: RerankDocument = omitted("the document, with return_documents")


class RerankV1Answer(BaseModel):
    """POST /v1/rerank (Cohere v1's and Jina's shape): the documents best first (top_n of them, if sent)."""

    model_config = ANSWER

    id: str = Field(description="the request's id")
    model: str = Field(description="the served model that answered")
    results: list[RerankV1Result]
