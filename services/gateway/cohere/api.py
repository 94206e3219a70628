"""Cohere's API as its SDK calls it: POST /v1/embed, /v2/embed and /v2/rerank (no I/O here).

Embedding types (shared/vectors/forms.py's COHERE_TYPES): a request asks for one or more of float, int8, uint8,
binary, ubinary and base64.
When they all share one form (base64 is float32's bytes), the worker makes that form, as on the
other routes; when they differ, the worker answers float32 once and each type is quantized here by
``embedfleet.shared.vectors.quantize.quantize``, the function the worker itself runs on the same float32 rows: the
same bytes, from one forward pass instead of one per type.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import orjson
from pydantic_core import ErrorDetails

from embedfleet.services.gateway.chunking import Chunking, chunk_places, chunking_of
from embedfleet.services.gateway.cohere.body import CohereEmbedV1Body, CohereEmbedV2Body, CohereTextContent
from embedfleet.services.gateway.http.body_errors import fault_error, read_body
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.images import ImageHeader, ImageUrl, placed, sources
from embedfleet.services.gateway.inputs import Inputs, Limits, within_count, within_limits
from embedfleet.services.gateway.rerank.api import RerankCall, query_within, texts_within
from embedfleet.services.gateway.rerank.body import CohereRerankV2Body
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol import EmbedOptions
from embedfleet.shared.vectors.forms import COHERE_TYPES, FLOAT32, FORMS
from embedfleet.shared.vectors.quantize import quantize

# Cohere's input_type -> the name of the model's prompt it selects (none of that name: no prompt)
INPUT_TYPES: dict[str, str | None] = {
    "search_query": "query",
    "search_document": "document",
    "classification": "classification",
    "clustering": "clustering",
    "image": None,  # images: no prompt
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
    task: str | None = None  # a task adapter of the model (EmbedOptions.task)
    # images ('images', or image_url items of v2's 'inputs'; ``inputs`` then holds the texts beside them)
    # sent as data URIs, and each image's index among the request's inputs; None: no images
    images: Inputs | None = None
    image_rows: tuple[int, ...] = ()
    sizes: tuple[ImageHeader, ...] = ()  # what each of ``images``' headers says, for the answer
    image_urls: tuple[ImageUrl, ...] = ()  # the images sent as URLs, fetched before they are embedded (with_fetched)

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
            task=self.task,
        )


def parse_embed(body: bytes, limits: Limits, version: int) -> CohereEmbed:
    """The request ``body`` holds (CohereEmbedV1Body or CohereEmbedV2Body by ``version``), within the
    gateway's ``limits``; ApiError otherwise."""
    doc: CohereEmbedV1Body | CohereEmbedV2Body = (
        read_body(CohereEmbedV2Body, body, _fault) if version == 2 else read_body(CohereEmbedV1Body, body, _fault)
    )
    uris: list[tuple[int, str]] = []  # (input, data URI or URL) of each image
    texts: str | list[str]
    if isinstance(doc, CohereEmbedV2Body) and doc.images is not None:
        if doc.texts is not None or doc.inputs is not None:
            raise ApiError(ErrorCode.INVALID_REQUEST, "send 'images' or texts ('texts', 'inputs'), not both", "images")
        field, texts = "images", []
        uris = list(enumerate(doc.images))
    elif isinstance(doc, CohereEmbedV2Body):
        field, texts, uris = _v2_texts(doc)
    else:
        field, texts = "texts", doc.texts
    v2 = doc if isinstance(doc, CohereEmbedV2Body) else None
    types = doc.embedding_types if v2 is None else doc.embedding_types or ["float"]
    within_count(len(uris) + (1 if isinstance(texts, str) else len(texts)), field, limits)  # before any is decoded
    images: Inputs | None = None
    sizes: tuple[ImageHeader, ...] = ()
    image_urls: tuple[ImageUrl, ...] = ()
    if uris:
        if v2 is not None and v2.chunking is not None:
            raise ApiError(ErrorCode.INVALID_REQUEST, "'chunking' cuts texts; images cannot be chunked", "chunking")
        where = [f"{field}[{i}]" for i, _ in uris]
        checked, image_urls = sources([uri for _, uri in uris], where, limits.images)
        images, sizes = Inputs([], None, [file for file, _ in checked]), tuple(header for _, header in checked)
    return CohereEmbed(
        version=version,
        model=doc.model,
        inputs=within_limits(Inputs([texts] if isinstance(texts, str) else texts, None), field, limits),
        input_type=INPUT_TYPES[doc.input_type] if doc.input_type else None,
        types=None if types is None else tuple(dict.fromkeys(types)),  # each type once, in the order asked
        dimensions=None if v2 is None else v2.output_dimension,
        truncation=TRUNCATE[doc.truncate or "END"],
        max_tokens=None if v2 is None else v2.max_tokens,
        chunking=None if v2 is None or v2.chunking is None else chunking_of(v2.chunking),
        task=doc.task,
        images=images,
        image_rows=tuple(i for i, _ in uris),
        sizes=sizes,
        image_urls=image_urls,
    )


def with_fetched(req: CohereEmbed, fetched: list[tuple[bytes, ImageHeader]]) -> CohereEmbed:
    """``req`` with the images its URLs name (``fetched``: each one's file and header) in their places."""
    assert req.images is not None and len(fetched) == len(req.image_urls)
    files = placed(req.images.images or [], req.image_urls, [file for file, _ in fetched])
    sizes = placed(req.sizes, req.image_urls, [header for _, header in fetched])
    return replace(req, images=Inputs([], None, files), sizes=tuple(sizes), image_urls=())


def _v2_texts(doc: CohereEmbedV2Body) -> tuple[str, str | list[str], list[tuple[int, str]]]:
    """Where v2's inputs came from ('texts' or 'inputs', one of them), the texts, and the images among
    'inputs' (each as (its index, its data URI or URL))."""
    if doc.inputs is None:
        if doc.texts is None:
            raise ApiError(ErrorCode.INVALID_REQUEST, "'texts' is required (or 'inputs', or 'images')", "texts")
        return "texts", doc.texts, []
    if doc.texts is not None:
        raise ApiError(ErrorCode.INVALID_REQUEST, "send 'texts' or 'inputs', not both", "inputs")
    texts, images = [], []
    for i, item in enumerate(doc.inputs):
        content = item.content[0]
        if isinstance(content, CohereTextContent):
            texts.append(content.text)
        else:
            images.append((i, content.image_url.url))
    return "inputs", texts, images


def _fault(errors: list[ErrorDetails]) -> ApiError:
    """An item of 'inputs' that is not one text or image item, in the words of what is served; every
    other fault as body_errors words it."""
    loc = errors[0]["loc"]
    if loc[:1] == ("inputs",) and len(loc) > 1 and isinstance(loc[1], int):
        return ApiError(
            ErrorCode.INVALID_REQUEST,
            f'\'inputs[{loc[1]}]\' must be {{"content": [ITEM]}}: one item, {{"type": "text", "text": ...}} or '
            '{"type": "image_url", "image_url": {"url": "data:image/..."}}',
            "inputs",
        )
    if loc[:1] == ("images",) and len(loc) == 2 and errors[0]["type"] == "string_pattern_mismatch":
        return ApiError(
            ErrorCode.INVALID_REQUEST,
            f"'images[{loc[1]}]' must be a data URI (data:image/png;base64,...) or an https:// URL",
            "images",
        )
    if loc == ("images",) and errors[0]["type"] == "too_long":
        return ApiError(
            ErrorCode.INVALID_REQUEST, "'images' are served on /v2/embed (Cohere's v2 API), not here", "images"
        )
    return fault_error(errors)


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
    if req.images is not None:  # as Cohere describes the images it embedded
        body["images"] = [
            {"width": s.width, "height": s.height, "format": s.format.lower(), "bit_depth": s.bit_depth}
            for s in req.sizes
        ]
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
    """v2's body (CohereRerankV2Body), within the gateway's ``limits``; documents longer than the model's
    limit are cut, as Cohere cuts them."""
    doc = read_body(CohereRerankV2Body, body)
    if doc.relevant_spans:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'relevant_spans' is not supported", "relevant_spans")
    call = RerankCall(
        model=doc.model,
        query=query_within(doc.query, limits),
        texts=texts_within(doc.documents, "documents", limits),
        top_n=doc.top_n,
        raw_scores=False,
        truncate=True,
        return_text=False,
    )
    return CohereRerank(call, doc.max_tokens_per_doc)


def render_rerank(request_id: str, indices: np.ndarray, scores: np.ndarray) -> bytes:
    results = [{"index": i, "relevance_score": s} for i, s in zip(indices.tolist(), scores.tolist())]
    return orjson.dumps({"id": request_id, "results": results, "meta": {"api_version": {"version": "2"}}})
