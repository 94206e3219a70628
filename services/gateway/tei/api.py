"""TEI-compatible routes (text-embeddings-inference): /embed, /embed_sparse, /embed_all, /tokenize, /info shapes
(no I/O here); the bodies are body.py's typed models."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson
from pydantic_core import ErrorDetails

from embedfleet.services.gateway.chunking import Chunking, body_chunking, chunk_places
from embedfleet.services.gateway.http.body_errors import input_fault, read_body
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.images import ImageUrl, split_items
from embedfleet.services.gateway.inputs import Inputs, Limits, typed_inputs
from embedfleet.services.gateway.openai.body import InputItem
from embedfleet.services.gateway.tei.body import EmbedAllBody, EmbedBody, EmbedSparseBody, TokenizeBody
from embedfleet.services.gateway.tei.tasks import model_type
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol import EmbedOptions, TokenizeResult
from embedfleet.shared.vectors.forms import EMBEDDING_TYPES, FORMS


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    inputs: Inputs
    options: EmbedOptions
    chunking: Chunking | None = None  # /embed's extension: long inputs cut into chunks (services/gateway/chunking.py)
    model: str | None = None  # the extension: which served model answers (None: the default)
    # /embed_all's {'image': ...} items (a page model's): the images sent as data URIs, and the index in
    # ``inputs`` of each image
    images: Inputs | None = None
    image_rows: tuple[int, ...] = ()
    image_urls: tuple[ImageUrl, ...] = ()  # the images sent as URLs, fetched before they are embedded


def _inputs_fault(errors: list[ErrorDetails]) -> ApiError:
    return input_fault(errors, "inputs")


def parse_embed(body: bytes, limits: Limits) -> EmbedRequest:
    """The request ``body`` holds (EmbedBody), within the gateway's ``limits``; ApiError otherwise."""
    doc = read_body(EmbedBody, body, _inputs_fault)
    inputs = typed_inputs(doc.inputs, "inputs", limits)
    options = EmbedOptions(
        normalize=doc.normalize is not False,
        dimensions=doc.dimensions,
        truncate=doc.truncate is True,  # TEI's default: refuse over-long inputs
        truncation_direction=doc.truncation_direction or "right",
        prompt_name=doc.prompt_name,
        dtype=_wire(doc.embedding_type),  # an extension: TEI answers float32 only
    )
    chunking = None if doc.chunking is None else body_chunking(doc.chunking, inputs, "inputs")
    return EmbedRequest(inputs, options, chunking, doc.model)


def _wire(embedding_type: str | None) -> str:
    """The wire name of the vector form ``embedding_type`` names (None: float32)."""
    return FORMS[EMBEDDING_TYPES[embedding_type or "float"].name].wire


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    texts: list[str]
    add_special_tokens: bool
    prompt_name: str | None
    model: str | None = None


def parse_tokenize(body: bytes, limits: Limits) -> TokenizeRequest:
    doc = read_body(TokenizeBody, body)
    inputs = typed_inputs(doc.inputs, "inputs", limits)
    return TokenizeRequest(inputs.texts, doc.add_special_tokens is not False, doc.prompt_name, doc.model)


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


def parse_embed_sparse(body: bytes, limits: Limits) -> EmbedRequest:
    """TEI's /embed_sparse (EmbedSparseBody), plus two pruning extensions: ``top_k`` (the k largest values
    of each vector) and ``threshold`` (values at or below it are dropped)."""
    doc = read_body(EmbedSparseBody, body, _inputs_fault)
    options = EmbedOptions(
        output="sparse",
        sparse_top_k=doc.top_k,
        sparse_threshold=doc.threshold,
        truncate=doc.truncate is True,
        truncation_direction=doc.truncation_direction or "right",
        prompt_name=doc.prompt_name,
    )
    return EmbedRequest(typed_inputs(doc.inputs, "inputs", limits), options, model=doc.model)


def read_embed_all(body: bytes) -> EmbedAllBody:
    """/embed_all's body (EmbedAllBody): its model is resolved before ``parse_embed_all`` asks what it makes."""
    return read_body(EmbedAllBody, body, _inputs_fault)


def parse_embed_all(doc: EmbedAllBody, limits: Limits, offers: tuple[str, ...]) -> EmbedRequest:
    """TEI's /embed_all: a vector per token. ``offers``: the outputs the model's workers make. A model
    with a multi-vector head (ColBERT-style, BGE-M3) answers its projected, normalised token vectors;
    others their last hidden states. The extension ``output`` ("tokens" / "multivector") chooses."""
    images: Inputs | None = None
    image_rows: tuple[int, ...] = ()
    image_urls: tuple[ImageUrl, ...] = ()
    if isinstance(doc.inputs, list) and isinstance(doc.inputs[0], InputItem):
        items = [(item.text, item.image) for item in doc.inputs if isinstance(item, InputItem)]  # the <items> member
        inputs, images, image_rows, image_urls = split_items(items, "inputs", limits)
    else:
        inputs = typed_inputs(doc.inputs, "inputs", limits)
    output = doc.output or ("multivector" if "multivector" in offers else "tokens")
    if output == "multivector" and "multivector" not in offers:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, "the model has no multi-vector head: ask 'output': 'tokens'", "output"
        )
    options = EmbedOptions(
        output=output,
        dtype=_wire(doc.embedding_type),
        input_type=doc.input_type,
        truncate=doc.truncate is True,
        truncation_direction=doc.truncation_direction or "right",
        prompt_name=doc.prompt_name,
    )
    return EmbedRequest(inputs, options, model=doc.model, images=images, image_rows=image_rows, image_urls=image_urls)


def render_sparse(rows: list) -> bytes:
    """[[{"index", "value"}, ...], ...]: each input's nonzero entries, indices ascending."""
    return orjson.dumps(
        [[{"index": i, "value": v} for i, v in zip(indices.tolist(), values.tolist())] for indices, values in rows]
    )


def render_all(rows: list, form: str = "float32") -> bytes:
    """[[[...], ...], ...]: per input, a vector per token."""
    dtype = FORMS[form].dtype
    return orjson.dumps([r.astype(dtype, copy=False) for r in rows], option=orjson.OPT_SERIALIZE_NUMPY)
