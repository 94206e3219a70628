"""TEI-compatible routes (text-embeddings-inference): /embed, /tokenize, /info shapes (no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson

from shared.errors import ErrorCode
from shared.protocol import EmbedOptions, TokenizeResult
from services.gateway.errors import ApiError
from services.gateway.inputs import Inputs, Limits, json_object, optional, parse_inputs, positive_dimensions


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    inputs: Inputs
    options: EmbedOptions


def parse_embed(body: bytes, limits: Limits) -> EmbedRequest:
    doc = json_object(body)
    if "inputs" not in doc:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'inputs' is required", "inputs")
    inputs = parse_inputs(doc["inputs"], "inputs", limits, allow_tokens=True)
    direction = optional(doc, "truncation_direction", str, "right").lower()
    if direction not in ("right", "left"):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'truncation_direction' must be 'Right' or 'Left'", "truncation_direction")
    options = EmbedOptions(
        normalize=optional(doc, "normalize", bool, True),
        dimensions=positive_dimensions(doc),
        truncate=optional(doc, "truncate", bool, False),  # TEI's default: refuse over-long inputs
        truncation_direction=direction,
        prompt_name=optional(doc, "prompt_name", str),
    )
    return EmbedRequest(inputs, options)


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
        inputs.texts, optional(doc, "add_special_tokens", bool, True), optional(doc, "prompt_name", str)
    )


def render_embed(vectors: np.ndarray) -> bytes:
    return orjson.dumps(vectors.astype(np.float32, copy=False), option=orjson.OPT_SERIALIZE_NUMPY)


def render_tokens(result: TokenizeResult) -> bytes:
    return orjson.dumps(
        [
            [{"id": i, "text": text, "special": special, "start": start, "stop": stop} for i, text, special, start, stop in row]
            for row in result.tokens
        ]
    )


def render_info(model: str, tokenizer: dict[str, str], worker: dict[str, str], limits: Limits, max_in_flight: int, version: str) -> bytes:
    return orjson.dumps(
        {
            "model_id": model,
            "model_sha": None,
            "model_dtype": worker.get("dtype", "float32"),
            "model_type": {"embedding": {"pooling": worker.get("pooling") or tokenizer.get("pooling", "mean")}},
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
