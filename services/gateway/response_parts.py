"""What several routes' answers share, as typed models: each API family's error body, where a chunk's
row lies, and a vector row as JSON numbers or base64.

Response models describe what a route answers: /openapi.json's response schemas are generated from
them, and the tests hold the bytes each route writes to them (``model_validate_json``). The routes
themselves write their answers with orjson (http/errors.py, http/formats.py, each family's api.py renderers): building a
model per answer would cost the hot path for nothing the bytes do not already say.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

# what a response model checks when a test holds an answer to it: exact types, no field it does not name
ANSWER = ConfigDict(strict=True, extra="forbid")


class OpenAIErrorDetail(BaseModel):
    model_config = ANSWER

    message: str
    type: str = Field(description="OpenAI's error type, e.g. invalid_request_error")
    param: str | None = Field(description="the request field at fault (dotted: 'chunking.size'), if one is")
    code: str | None = Field(description="embedfleet's error code (shared/errors.py), e.g. model_not_found")


class OpenAIError(BaseModel):
    """An error on the OpenAI routes and embedfleet's own (jobs, search, models)."""

    model_config = ANSWER

    error: OpenAIErrorDetail


class TeiError(BaseModel):
    """An error on the TEI routes."""

    model_config = ANSWER

    error: str
    error_type: str = Field(description="TEI's kind: Validation, Tokenizer, Overloaded, Backend, Unhealthy")


class CohereError(BaseModel):
    """An error on the Cohere routes (/v1/embed, /v2/embed, /v2/rerank)."""

    model_config = ANSWER

    message: str


class ChunkPlace(BaseModel):
    """Where a chunk's row lies (``chunking`` with ``"return": "chunks"``): input[start:end] is its text."""

    model_config = ANSWER

    index: int = Field(description="the input")
    chunk: int = Field(description="the chunk's number within its input")
    start: int = Field(description="the chunk's first character")
    end: int = Field(description="past the chunk's last character")


# a row as JSON numbers (integers for int8, uint8, binary, ubinary), or (encoding_format base64) its
# little-endian bytes
Row = list[float] | Annotated[str, Field(json_schema_extra={"contentEncoding": "base64"})]


def _without_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def omitted(description: str | None = None) -> Any:
    """A field an answer leaves out where it does not apply (it is never null): optional in the schema,
    with no default to show, and refused as null by the model. Any, so that a type checker takes the
    type the field is annotated with."""
    return Field(default=None, description=description, json_schema_extra=_without_default)


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema with the models it refers to written in place (no components): for the
    small shapes every route repeats, such as the error bodies."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)
