"""Cohere's API as its SDK calls it: POST /v1/embed, /v2/embed and /v2/rerank (no I/O here).

Embedding types (shared/vector_forms.py's COHERE_TYPES): a request asks for one or more of float, int8, uint8,
binary, ubinary and base64.
When they all share one form (base64 is float32's bytes), the worker makes that form, as on the
other routes; when they differ, the worker answers float32 once and each type is quantized here by
``embedfleet.shared.quantize.quantize``, the function the worker itself runs on the same float32 rows: the
same bytes, from one forward pass instead of one per type.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from embedfleet.services.gateway.chunking import Chunking, chunk_places, parse_text_chunking
from embedfleet.services.gateway.errors import ApiError
from embedfleet.services.gateway.inputs import (
    Inputs,
    Limits,
    json_object,
    json_type,
    optional,
    parse_inputs,
    positive_dimensions,
)
from embedfleet.services.gateway.rerank_api import RerankCall, query_field, texts_field, top_n_field
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol import EmbedOptions
from embedfleet.shared.quantize import quantize
from embedfleet.shared.vector_forms import COHERE_TYPES, FLOAT32, FORMS

# Cohere's input_type -> the name of the model's prompt it selects (none of that name: no prompt)
INPUT_TYPES = {
    "search_query": "query",
    "search_document": "document",
    "classification": "classification",
    "clustering": "clustering",
}
# truncate -> the side cut (None: over-long inputs are refused); Cohere's default is END
TRUNCATE = {"NONE": None, "START": "left", "END": "right"}


@dataclass(frozen=True, slots=True)
class CohereEmbed:
    version: int  # 1 or 2: the API's version, which decides the answer's shape
    model: str | None
    inputs: Inputs
    input_type: str | None  # the prompt name (INPUT_TYPES' values)
    types: tuple[str, ...] | None  # None: v1's plain float answer ("embeddings_floats")
    dimensions: int | None  # v2's output_dimension
    truncation: str | None  # "right", "left", or None: over-long inputs are errors
    max_tokens: int | None  # v2: a cap per input, accepted when it does not cut below the model's limit
    chunking: Chunking | None = None  # v2's extension: long inputs cut into chunks (services/gateway/chunking.py)

    @property
    def form(self) -> str:
        """The form the worker makes: the types' one form, or float32 for several (quantized here)."""
        forms = {COHERE_TYPES[t].name for t in self.types or ("float",)}
        return forms.pop() if len(forms) == 1 else FLOAT32.name

    def options(self) -> EmbedOptions:
        return EmbedOptions(
            dimensions=self.dimensions,
            dtype=FORMS[self.form].wire,
            truncate=self.truncation is not None,
            truncation_direction=self.truncation or "right",
            input_type=self.input_type,
        )


def parse_embed(body: bytes, limits: Limits, version: int) -> CohereEmbed:
    doc = json_object(body)
    if doc.get("images"):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'images' are not supported: the served models embed text", "images")
    if version == 2 and doc.get("inputs") is not None:
        if doc.get("texts") is not None:
            raise ApiError(ErrorCode.INVALID_REQUEST, "send 'texts' or 'inputs', not both", "inputs")
        inputs = parse_inputs(_input_texts(doc["inputs"]), "inputs", limits, allow_tokens=False)
    elif "texts" in doc:
        inputs = parse_inputs(doc["texts"], "texts", limits, allow_tokens=False)
    else:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, "'texts' is required" + (" (or 'inputs')" if version == 2 else ""), "texts"
        )
    types = _embedding_types(doc.get("embedding_types"))
    dimensions = positive_dimensions(doc, "output_dimension") if version == 2 else None
    max_tokens = optional(doc, "max_tokens", int) if version == 2 else None
    if max_tokens is not None and max_tokens <= 0:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'max_tokens' must be a positive integer", "max_tokens")
    if version == 2:
        optional(doc, "priority", int)  # accepted: every request here has the same priority
    return CohereEmbed(
        version=version,
        model=optional(doc, "model", str),
        inputs=inputs,
        input_type=_input_type(doc),
        types=types if types is not None or version == 1 else ("float",),
        dimensions=dimensions,
        truncation=_truncation(doc),
        max_tokens=max_tokens,
        chunking=parse_text_chunking(doc, inputs, "texts") if version == 2 else None,
    )


def _input_texts(raw: Any) -> list[str]:
    """v2's ``inputs``: ``[{"content": [{"type": "text", "text": ...}]}]``, one text item an input."""
    if not isinstance(raw, list):
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'inputs' must be a list, got {json_type(raw)}", "inputs")
    texts = []
    for i, item in enumerate(raw):
        content = item.get("content") if isinstance(item, dict) else None
        part = content[0] if isinstance(content, list) and len(content) == 1 else None
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ApiError(
                ErrorCode.INVALID_REQUEST,
                f'\'inputs[{i}]\' must be {{"content": [{{"type": "text", '
                '"text": ...}]}: one text item (the served models embed text)',
                "inputs",
            )
        texts.append(part["text"])
    return texts


def _embedding_types(raw: Any) -> tuple[str, ...] | None:
    if raw is None:
        return None
    known = ", ".join(f"'{t}'" for t in COHERE_TYPES)
    if not isinstance(raw, list) or not raw or not all(isinstance(t, str) and t in COHERE_TYPES for t in raw):
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"'embedding_types' must be a non-empty list of {known}", "embedding_types"
        )
    return tuple(dict.fromkeys(raw))  # each type once, in the order asked


def _input_type(doc: dict) -> str | None:
    name = optional(doc, "input_type", str)
    if name is not None and name not in INPUT_TYPES:
        known = ", ".join(f"'{t}'" for t in INPUT_TYPES)
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'input_type' must be one of {known}", "input_type")
    return INPUT_TYPES.get(name) if name else None


def _truncation(doc: dict) -> str | None:
    name = optional(doc, "truncate", str, "END").upper()
    if name not in TRUNCATE:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'truncate' must be 'NONE', 'START' or 'END'", "truncate")
    return TRUNCATE[name]


def check_model_limits(
    param: str, cap: int | None, max_length: int, dimensions: int | None = None, dim: int = 0
) -> None:
    """Limits only the model knows: a token cap (``param``) below its ``max_length`` would cut inputs
    shorter than the tokenizer does, which is not offered; ``dimensions`` past its ``dim`` do not exist.
    A limit of 0 is unknown and not checked."""
    if cap is not None and max_length and cap < max_length:
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'{param}' {cap} is below the model's limit of {max_length} tokens: "
            f"inputs are cut at the model's limit only (send {max_length} or more)",
            param,
        )
    if dimensions is not None and dim and dimensions > dim:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"'output_dimension' {dimensions} exceeds the model's {dim}", "output_dimension"
        )


def render_embed(
    req: CohereEmbed, request_id: str, vectors: np.ndarray, form: str, tokens: int, chunks: list | None = None
) -> bytes:
    """``vectors``: [n, width(dim)] rows of ``form`` (req.form). ``chunks``: per input its
    TextChunks, a row each (the rows input by input): the extension ``chunks`` then says where each row
    lies, ``{"index", "chunk", "start", "end"}``, aligned with every type's rows."""
    meta = {"api_version": {"version": str(req.version)}, "billed_units": {"input_tokens": tokens}}
    stored = np.ascontiguousarray(vectors, dtype=FORMS[form].dtype)  # orjson serialises contiguous arrays only
    body: dict[str, Any] = {"id": request_id, "texts": req.inputs.texts, "meta": meta}
    if chunks is not None:
        body["chunks"] = chunk_places(chunks)
    if req.types is None:
        body |= {"response_type": "embeddings_floats", "embeddings": stored}
    else:
        body |= {"response_type": "embeddings_by_type", "embeddings": {t: _rows_of(t, stored, form) for t in req.types}}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def _rows_of(kind: str, stored: np.ndarray, form: str) -> Any:
    wanted = COHERE_TYPES[kind].name
    if wanted != form:
        assert form == FLOAT32.name, form  # several forms are only ever made from float32 rows
        stored = quantize(stored, wanted)
    if kind == "base64":  # each row's little-endian float32 bytes
        return [base64.b64encode(row.tobytes()).decode() for row in stored]
    return stored


@dataclass(frozen=True, slots=True)
class CohereRerank:
    call: RerankCall
    max_tokens_per_doc: int | None


def parse_rerank(body: bytes, limits: Limits) -> CohereRerank:
    """v2: ``{"model", "query", "documents": [str], "top_n", "max_tokens_per_doc"}``; documents longer
    than the model's limit are cut, as Cohere cuts them."""
    doc = json_object(body)
    query = query_field(doc, limits)
    if "documents" not in doc:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'documents' is required", "documents")
    texts = texts_field(doc["documents"], "documents", limits, objects=False)
    cap = optional(doc, "max_tokens_per_doc", int)
    if cap is not None and cap <= 0:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, "'max_tokens_per_doc' must be a positive integer", "max_tokens_per_doc"
        )
    if doc.get("relevant_spans"):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'relevant_spans' is not supported", "relevant_spans")
    optional(doc, "priority", int)  # accepted: every request here has the same priority
    call = RerankCall(
        model=optional(doc, "model", str),
        query=query,
        texts=texts,
        top_n=top_n_field(doc),
        raw_scores=False,
        truncate=True,
        return_text=False,
    )
    return CohereRerank(call, cap)


def render_rerank(request_id: str, indices: np.ndarray, scores: np.ndarray) -> bytes:
    results = [{"index": i, "relevance_score": s} for i, s in zip(indices.tolist(), scores.tolist())]
    return orjson.dumps({"id": request_id, "results": results, "meta": {"api_version": {"version": "2"}}})
