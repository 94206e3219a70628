"""TEI-compatible routes (text-embeddings-inference): /embed, /tokenize, /info shapes (no I/O here)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import orjson

from embedfleet.services.gateway.chunking import Chunking, chunk_places, parse_text_chunking
from embedfleet.services.gateway.errors import ApiError
from embedfleet.services.gateway.inputs import (
    Inputs,
    Limits,
    embedding_form,
    json_object,
    name_field,
    optional,
    parse_inputs,
    positive_dimensions,
)
from embedfleet.services.gateway.tei_tasks import model_type
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol import EmbedOptions, TokenizeResult
from embedfleet.shared.protocol.messages import MAX_SPARSE_TOP_K
from embedfleet.shared.vector_forms import FORMS


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    inputs: Inputs
    options: EmbedOptions
    chunking: Chunking | None = None  # /embed's extension: long inputs cut into chunks (services/gateway/chunking.py)


def parse_embed(body: bytes, limits: Limits) -> EmbedRequest:
    doc = json_object(body)
    if "inputs" not in doc:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'inputs' is required", "inputs")
    inputs = parse_inputs(doc["inputs"], "inputs", limits, allow_tokens=True)
    direction = optional(doc, "truncation_direction", str, "right").lower()
    if direction not in ("right", "left"):
        raise ApiError(
            ErrorCode.INVALID_REQUEST, "'truncation_direction' must be 'Right' or 'Left'", "truncation_direction"
        )
    options = EmbedOptions(
        normalize=optional(doc, "normalize", bool, True),
        dimensions=positive_dimensions(doc),
        truncate=optional(doc, "truncate", bool, False),  # TEI's default: refuse over-long inputs
        truncation_direction=direction,
        prompt_name=name_field(doc, "prompt_name"),
        dtype=FORMS[embedding_form(doc)].wire,  # an extension: TEI answers float32 only
    )
    return EmbedRequest(inputs, options, parse_text_chunking(doc, inputs, "inputs"))


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    texts: list[str]
    add_special_tokens: bool
    prompt_name: str | None


def parse_tokenize(body: bytes, limits: Limits) -> TokenizeRequest:
    doc = json_object(body)
    if "inputs" not in doc:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'inputs' is required", "inputs")
    inputs = parse_inputs(doc["inputs"], "inputs", limits, allow_tokens=False)
    return TokenizeRequest(
        inputs.texts, optional(doc, "add_special_tokens", bool, True), name_field(doc, "prompt_name")
    )


def render_embed(vectors: np.ndarray, form: str = "float32") -> bytes:
    """Rows of ``form`` as JSON numbers (integers for int8, uint8 and the packed bytes of binary / ubinary)."""
    return orjson.dumps(vectors.astype(FORMS[form].dtype, copy=False), option=orjson.OPT_SERIALIZE_NUMPY)


def render_embed_chunks(vectors: np.ndarray, form: str, chunks: list) -> bytes:
    """/embed's answer with ``"return": "chunks"``: per input (TEI's outer list) a list of its chunks,
    ``{"chunk", "start", "end", "embedding"}``, ``inputs[i][start:end]`` being the chunk's text.
    ``vectors``: a row of ``form`` per chunk, input by input; ``chunks``: per input its TextChunks."""
    answer: list[list[dict]] = [[] for _ in chunks]
    for place, row in zip(chunk_places(chunks), np.ascontiguousarray(vectors, dtype=FORMS[form].dtype)):
        answer[place.pop("index")].append({**place, "embedding": row})
    return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)


def render_tokens(result: TokenizeResult) -> bytes:
    return orjson.dumps(
        [
            [
                {"id": i, "text": text, "special": special, "start": start, "stop": stop}
                for i, text, special, start, stop in row
            ]
            for row in result.tokens
        ]
    )


def render_info(
    model: str, tokenizer: dict[str, str], worker: dict[str, str], limits: Limits, max_in_flight: int, version: str
) -> bytes:
    return orjson.dumps(
        {
            "model_id": model,
            "model_sha": None,
            "model_dtype": worker.get("dtype", "float32"),
            "model_type": model_type(worker, tokenizer),
            "max_concurrent_requests": max_in_flight,
            "max_input_length": int(tokenizer.get("max_seq_length", 0)),
            "max_batch_tokens": int(worker.get("max_batch_tokens", 0)),
            "max_batch_requests": None,
            "max_client_batch_size": limits.max_inputs,
            "auto_truncate": False,
            "tokenization_workers": None,
            "version": version,
        }
    )


def model_field(body: bytes) -> str | None:
    """The field ``model`` of a body: which of several served models answers (None: the default model)."""
    return optional(json_object(body), "model", str)


def _common_options(doc: dict) -> dict:
    direction = optional(doc, "truncation_direction", str, "right").lower()
    if direction not in ("right", "left"):
        raise ApiError(
            ErrorCode.INVALID_REQUEST, "'truncation_direction' must be 'Right' or 'Left'", "truncation_direction"
        )
    return dict(
        truncate=optional(doc, "truncate", bool, False),
        truncation_direction=direction,
        prompt_name=name_field(doc, "prompt_name"),
    )


def parse_embed_sparse(body: bytes, limits: Limits) -> EmbedRequest:
    """TEI's /embed_sparse, plus two pruning extensions: ``top_k`` (the k largest values of each
    vector) and ``threshold`` (values at or below it are dropped)."""
    doc = json_object(body)
    if "inputs" not in doc:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'inputs' is required", "inputs")
    inputs = parse_inputs(doc["inputs"], "inputs", limits, allow_tokens=True)
    top_k = optional(doc, "top_k", int)
    if top_k is not None and not 0 < top_k <= MAX_SPARSE_TOP_K:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"'top_k' must be in 1..{MAX_SPARSE_TOP_K}", "top_k")
    threshold = doc.get("threshold")
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold)
    ):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'threshold' must be a number", "threshold")
    options = EmbedOptions(output="sparse", sparse_top_k=top_k, sparse_threshold=threshold, **_common_options(doc))
    return EmbedRequest(inputs, options)


def parse_embed_all(body: bytes, limits: Limits, offers: tuple[str, ...]) -> EmbedRequest:
    """TEI's /embed_all: a vector per token. ``offers``: the outputs the model's workers make. A model
    with a multi-vector head (ColBERT-style, BGE-M3) answers its projected, normalised token vectors;
    others their last hidden states. The extension ``output`` ("tokens" / "multivector") chooses."""
    doc = json_object(body)
    if "inputs" not in doc:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'inputs' is required", "inputs")
    inputs = parse_inputs(doc["inputs"], "inputs", limits, allow_tokens=True)
    output = optional(doc, "output", str, "multivector" if "multivector" in offers else "tokens")
    if output not in ("tokens", "multivector"):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'output' must be 'tokens' or 'multivector'", "output")
    if output == "multivector" and "multivector" not in offers:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, "the model has no multi-vector head: ask 'output': 'tokens'", "output"
        )
    form = embedding_form(doc)
    input_type = optional(doc, "input_type", str)
    if input_type not in (None, "query", "document"):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'input_type' must be 'query' or 'document'", "input_type")
    options = EmbedOptions(output=output, dtype=FORMS[form].wire, input_type=input_type, **_common_options(doc))
    return EmbedRequest(inputs, options)


def render_sparse(rows: list) -> bytes:
    """[[{"index", "value"}, ...], ...]: each input's nonzero entries, indices ascending."""
    return orjson.dumps(
        [[{"index": i, "value": v} for i, v in zip(indices.tolist(), values.tolist())] for indices, values in rows]
    )


def render_all(rows: list, form: str = "float32") -> bytes:
    """[[[...], ...], ...]: per input, a vector per token."""
    dtype = FORMS[form].dtype
    return orjson.dumps([r.astype(dtype, copy=False) for r in rows], option=orjson.OPT_SERIALIZE_NUMPY)
