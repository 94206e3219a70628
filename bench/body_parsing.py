"""The CPU of parsing a request body: each typed route's model against the hand-written parser it
replaced (and msgspec for /v1/embeddings), in one run.

    python -m bench.body_parsing            # msgspec's row needs msgspec (pip install msgspec)

Per body: microseconds for one parse into the route's EmbeddingsRequest, best of several rounds, and
each option's time over the hand-written parser's:
- hand: the parser the route had, orjson and a check a field (inputs.py's helpers, which the TEI and
  Cohere routes still use);
- pydantic: the route's parse now, EmbeddingsBody.model_validate_json then the gateway's limits;
- pydantic model: model_validate_json alone, what the typed model costs by itself;
- msgspec: a msgspec Struct with the same bounds, then the same limits. msgspec takes one array type in
  a union, so 'input' is a str or a list checked by hand as before.
The bodies: one query (the hot path), eight inputs, and every field set. A second table does the same
for Cohere's /v2/embed (as its SDK sends a query and eight documents), its hand-written parser against
its typed model (CohereEmbedV2Body). docs/performance.md ("Parsing a request body") records runs.

A third table: POST /v1/jobs' body (its fields checked together, every document read), the hand
parser the route had against JobBody (jobs/body.py) and jobs/api.py's checks, for one document, 1,000
documents with a metadata field each, and every field set.

A fourth table: TEI's /embed, the parser the route had against tei_api.parse_embed (EmbedBody)
and EmbedBody's validation alone; the same three kinds of body.
"""

import argparse
import math
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

import orjson

from bench.hand_parsers import (
    embedding_form,
    name_field,
    parse_chunking,
    parse_inputs,
    parse_text_chunking,
    positive_dimensions,
)
from embedfleet.services.gateway.cohere.api import INPUT_TYPES, TRUNCATE, CohereEmbed
from embedfleet.services.gateway.cohere.api import parse_embed as cohere_parse_embed
from embedfleet.services.gateway.cohere.body import CohereEmbedV2Body
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Limits, json_object, optional
from embedfleet.services.gateway.jobs.api import check_job_id, inline_documents, job_options, parse_job
from embedfleet.services.gateway.openai.api import EmbeddingsRequest, parse_embeddings_request
from embedfleet.services.gateway.openai.body import EmbeddingsBody
from embedfleet.services.gateway.tei.api import EmbedRequest
from embedfleet.services.gateway.tei.api import parse_embed as tei_parse_embed
from embedfleet.services.gateway.tei.body import EmbedBody
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.jobs.state import JOB_OUTPUTS
from embedfleet.shared.protocol import MAX_DIMENSION, EmbedOptions
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking
from embedfleet.shared.vectors.forms import COHERE_TYPES, FORMS, form_named

LIMITS = Limits(max_inputs=2048, max_input_chars=65536)  # the gateway's defaults
MODEL = "all-MiniLM-L6-v2"


def bodies() -> dict[str, bytes]:
    texts = [f"passage {i}: the quick brown fox jumps over the lazy dog near the river bank" for i in range(8)]
    every = {
        "model": MODEL,
        "input": texts[:2],
        "encoding_format": "base64",
        "dimensions": 256,
        "user": "user-1",
        "input_type": "query",
        "embedding_type": "int8",
        "chunking": {"size": 128, "overlap": 16, "boundary": "sentence", "late": False, "return": "chunks"},
    }
    return {
        "one query": orjson.dumps({"model": MODEL, "input": "what is the capital of france?"}),
        "8 inputs": orjson.dumps({"model": MODEL, "input": texts}),
        "every field": orjson.dumps(every),
    }


def hand_parse(body: bytes, limits: Limits) -> EmbeddingsRequest:
    """The route's hand-written parser, as it was before the typed model."""
    doc = json_object(body)
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'model' is required and must be a string", "model")
    if "input" not in doc:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'input' is required", "input")
    inputs = parse_inputs(doc["input"], "input", limits, allow_tokens=True)
    encoding_format = optional(doc, "encoding_format", str, "float")
    if encoding_format not in ("float", "base64"):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'encoding_format' must be 'float' or 'base64'", "encoding_format")
    optional(doc, "user", str)
    input_type = optional(doc, "input_type", str)
    if input_type is not None and input_type not in ("query", "document"):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'input_type' must be 'query' or 'document'", "input_type")
    chunking = parse_text_chunking(doc, inputs, "input")
    return EmbeddingsRequest(
        model, inputs, encoding_format, positive_dimensions(doc), input_type, embedding_form(doc), chunking
    )


def tei_bodies() -> dict[str, bytes]:
    """/embed's bodies, as bodies() for /v1/embeddings: one query, eight inputs, every field."""
    texts = [f"passage {i}: the quick brown fox jumps over the lazy dog near the river bank" for i in range(8)]
    every = {
        "inputs": texts[:2],
        "normalize": False,
        "truncate": True,
        "truncation_direction": "Left",
        "prompt_name": "query",
        "dimensions": 256,
        "embedding_type": "int8",
        "chunking": {"size": 128, "overlap": 16, "boundary": "sentence", "late": False, "return": "chunks"},
        "model": MODEL,
    }
    return {
        "one query": orjson.dumps({"inputs": "what is the capital of france?"}),
        "8 inputs": orjson.dumps({"inputs": texts}),
        "every field": orjson.dumps(every),
    }


def tei_hand_parse(body: bytes, limits: Limits) -> EmbedRequest:
    """/embed's hand-written parser, as it was before the typed model (the model field read as the route did)."""
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
        truncate=optional(doc, "truncate", bool, False),
        truncation_direction=direction,
        prompt_name=name_field(doc, "prompt_name"),
        dtype=FORMS[embedding_form(doc)].wire,
    )
    model = optional(json_object(body), "model", str)  # the route read it apart: a second parse
    return EmbedRequest(inputs, options, parse_text_chunking(doc, inputs, "inputs"), model)


def msgspec_parser() -> Callable[[bytes, Limits], EmbeddingsRequest] | None:
    """The same checks as a msgspec Struct (None without msgspec)."""
    try:
        import msgspec
        from msgspec import Meta
    except ImportError:
        return None

    from embedfleet.services.gateway.chunking import Chunking

    class ChunkingStruct(msgspec.Struct, forbid_unknown_fields=True, frozen=True, rename={"returns": "return"}):
        size: Annotated[int, Meta(ge=1)]
        overlap: Annotated[int, Meta(ge=0)] = 0
        boundary: Literal["token", "sentence"] = "token"
        late: bool = False
        returns: Literal["chunks", "mean"] = "chunks"

    class Body(msgspec.Struct, frozen=True):
        model: Annotated[str, Meta(min_length=1)]
        input: str | list[Any]
        encoding_format: Literal["float", "base64"] | None = "float"
        dimensions: Annotated[int, Meta(ge=1, le=MAX_DIMENSION)] | None = None
        user: str | None = None
        input_type: Literal["query", "document"] | None = None
        embedding_type: Literal["float", "float32", "float16", "int8", "uint8", "binary", "ubinary"] | None = "float"
        chunking: ChunkingStruct | None = None

    def parse(body: bytes, limits: Limits) -> EmbeddingsRequest:
        try:
            doc = msgspec.json.decode(body, type=Body)
        except msgspec.ValidationError as exc:
            raise ApiError(ErrorCode.INVALID_REQUEST, str(exc)) from None
        inputs = parse_inputs(doc.input, "input", limits, allow_tokens=True)
        c = doc.chunking
        chunking = None if c is None else Chunking(ChunkSpec(c.size, c.overlap, c.boundary), c.late, c.returns)
        form = form_named(doc.embedding_type or "float").name
        return EmbeddingsRequest(
            doc.model, inputs, doc.encoding_format or "float", doc.dimensions, doc.input_type, form, chunking
        )

    return parse


def cohere_bodies() -> dict[str, bytes]:
    """/v2/embed's bodies as Cohere's SDK sends them (ClientV2.embed)."""
    docs = [f"passage {i}: the quick brown fox jumps over the lazy dog near the river bank" for i in range(8)]
    common = {"model": MODEL, "embedding_types": ["float"]}
    return {
        "query": orjson.dumps({**common, "texts": ["what is the capital of france?"], "input_type": "search_query"}),
        "8 documents": orjson.dumps({**common, "texts": docs, "input_type": "search_document"}),
    }


def cohere_hand_parse(body: bytes, limits: Limits) -> CohereEmbed:
    """/v2/embed's hand-written parser before the typed model, the same checks in the same order (its
    'inputs' branch left out: the bodies give 'texts'; error messages shortened)."""
    doc = json_object(body)
    if doc.get("images"):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'images' are not supported", "images")
    if doc.get("inputs") is not None:
        raise ApiError(ErrorCode.INVALID_REQUEST, "the benchmark's bodies have 'texts'", "inputs")
    if "texts" not in doc:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'texts' is required (or 'inputs')", "texts")
    inputs = parse_inputs(doc["texts"], "texts", limits, allow_tokens=False)
    raw = doc.get("embedding_types")
    if raw is not None and (not isinstance(raw, list) or not raw or not all(t in COHERE_TYPES for t in raw)):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'embedding_types' must be a non-empty list", "embedding_types")
    max_tokens = optional(doc, "max_tokens", int)
    if max_tokens is not None and max_tokens <= 0:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'max_tokens' must be a positive integer", "max_tokens")
    optional(doc, "priority", int)
    input_type = optional(doc, "input_type", str)
    if input_type is not None and input_type not in INPUT_TYPES:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'input_type' must be one of Cohere's", "input_type")
    truncate = optional(doc, "truncate", str, "END").upper()
    if truncate not in TRUNCATE:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'truncate' must be 'NONE', 'START' or 'END'", "truncate")
    return CohereEmbed(
        version=2,
        model=optional(doc, "model", str),
        inputs=inputs,
        input_type=INPUT_TYPES.get(input_type) if input_type else None,
        types=tuple(dict.fromkeys(raw)) if raw is not None else ("float",),
        dimensions=positive_dimensions(doc, "output_dimension"),
        truncation=TRUNCATE[truncate],
        max_tokens=max_tokens,
        chunking=parse_text_chunking(doc, inputs, "texts"),
    )


# what a job's submission parses into: options, form, chunking, documents, their metadata
Job = tuple[EmbedOptions, str, JobChunking | None, list[tuple[str, str]], dict[str, dict] | None]


def job_bodies() -> dict[str, bytes]:
    text = "the quick brown fox jumps over the lazy dog near the river bank"
    every = {
        "model": MODEL,
        "id": "bench-job",
        "documents": [{"id": "a", "text": text}, {"id": 2, "text": text}],
        "input_type": "document",
        "embedding_type": "float16",
        "output": "dense",
        "batch_size": 32,
        "chunking": {"size": 128, "overlap": 16, "boundary": "sentence", "late": False},
        "with_text": True,
    }
    many = [{"id": f"doc-{i}", "text": f"passage {i}: {text}", "lang": "en"} for i in range(1000)]
    return {
        "1 document": orjson.dumps({"documents": [{"id": "a", "text": text}]}),
        "1000 docs": orjson.dumps({"documents": many}),
        "every field": orjson.dumps(every),
    }


def hand_parse_job(body: bytes) -> Job:
    """The checks of POST /v1/jobs' body as the route made them before its typed model (no I/O)."""
    doc = json_object(body)
    batch_size = optional(doc, "batch_size", int, 64)
    if not 0 < batch_size <= 4096:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'batch_size' must be in 1..4096", "batch_size")
    input_type = optional(doc, "input_type", str)
    if input_type not in (None, "query", "document"):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'input_type' must be 'query' or 'document'", "input_type")
    form = embedding_form(doc)
    output = optional(doc, "output", str, "dense")
    if output not in JOB_OUTPUTS:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'output' must be 'dense', 'sparse' or 'multivector'", "output")
    options = EmbedOptions(input_type=input_type, dtype=FORMS[form].wire, output=output)
    parsed = parse_chunking(doc, keys=("size", "overlap", "boundary", "late"))
    with_text = optional(doc, "with_text", bool, False)
    chunking = None if parsed is None else JobChunking(parsed.spec, parsed.late, with_text)
    if "id" in doc:
        check_job_id(doc["id"])
    raw = doc.get("documents")
    if not isinstance(raw, list) or not raw:
        raise ApiError(ErrorCode.INVALID_REQUEST, "'documents' must be a non-empty list", "documents")
    docs = []
    for i, d in enumerate(raw):
        if not (
            isinstance(d, dict)
            and isinstance(d.get("id"), str | int)
            and not isinstance(d.get("id"), bool)
            and isinstance(d.get("text"), str)
        ):
            raise ApiError(ErrorCode.INVALID_REQUEST, f"'documents[{i}]' must be {{id, text}}", "documents")
        docs.append((str(d["id"]), d["text"]))
    seen: set[str] = set()
    fields = {str(d["id"]): {k: v for k, v in d.items() if k not in ("id", "text")} for d in raw if len(d) > 2}
    for doc_id, _ in docs:
        if doc_id in seen:
            raise ApiError(ErrorCode.INVALID_REQUEST, "document ids must be unique", "documents")
        seen.add(doc_id)
    return options, form, chunking, docs, fields or None


def typed_parse_job(body: bytes) -> Job:
    """The route's parse now: JobBody, then the checks of the fields together (jobs/api.py)."""
    doc = parse_job(body)
    options, form, chunking = job_options(doc)
    if doc.id is not None:
        check_job_id(doc.id)
    return options, form, chunking, *inline_documents(doc.documents)


def interleaved(
    options: dict[str, Callable[[bytes], object]], body: bytes, rounds: int, number: int
) -> dict[str, float]:
    """Best microseconds a parse for each option, the options taking turns round by round (a loaded machine
    then slows each alike)."""
    best = dict.fromkeys(options, math.inf)
    for _ in range(rounds):
        for name, parse in options.items():
            t0 = time.perf_counter()
            for _ in range(number):
                parse(body)
            best[name] = min(best[name], (time.perf_counter() - t0) / number * 1e6)
    return best


def table(options: dict[str, Callable[[bytes], object]], bodies: dict[str, bytes], rounds: int, number: int) -> None:
    """A row per body: its bytes, each option's best µs a parse, each option's time over the hand parser's."""
    print(f"{'body':<12} {'bytes':>5} " + " ".join(f"{name + ' µs':>16}" for name in options) + "   / hand")
    for name, body in bodies.items():
        for parse in options.values():
            parse(body)  # each parses every body (a refusal would raise here)
        us = interleaved(options, body, rounds, number)
        ratios = " ".join(f"{option} {us[option] / us['hand']:.2f}" for option in options if option != "hand")
        print(f"{name:<12} {len(body):>5} " + " ".join(f"{v:>16.2f}" for v in us.values()) + f"   {ratios}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30, help="best of this many rounds")
    ap.add_argument("--number", type=int, default=2000, help="parses a round")
    args = ap.parse_args(argv)
    options: dict[str, Callable[[bytes], object]] = {
        "hand": lambda b: hand_parse(b, LIMITS),
        "pydantic": lambda b: parse_embeddings_request(b, LIMITS),
        "pydantic model": EmbeddingsBody.model_validate_json,
    }
    with_msgspec = msgspec_parser()
    if with_msgspec is not None:
        options["msgspec"] = lambda b: with_msgspec(b, LIMITS)
    table(options, bodies(), args.rounds, args.number)
    print("\n/v2/embed (Cohere)")
    cohere: dict[str, Callable[[bytes], object]] = {
        "hand": lambda b: cohere_hand_parse(b, LIMITS),
        "pydantic": lambda b: cohere_parse_embed(b, LIMITS, 2),
        "pydantic model": CohereEmbedV2Body.model_validate_json,
    }
    table(cohere, cohere_bodies(), args.rounds, args.number)
    print("\n/embed (TEI)")
    tei: dict[str, Callable[[bytes], object]] = {
        "hand": lambda b: tei_hand_parse(b, LIMITS),
        "pydantic": lambda b: tei_parse_embed(b, LIMITS),
        "pydantic model": EmbedBody.model_validate_json,
    }
    table(tei, tei_bodies(), args.rounds, args.number)
    jobs_table(args.rounds, args.number)


def jobs_table(rounds: int, number: int) -> None:
    """POST /v1/jobs' body: the hand parser against the typed model, µs a body."""
    options: dict[str, Callable[[bytes], object]] = {
        "hand": hand_parse_job,
        "pydantic": typed_parse_job,
        "pydantic model": parse_job,
    }
    print("\n/v1/jobs")
    print(f"{'body':<12} {'bytes':>6} " + " ".join(f"{name + ' µs':>16}" for name in options) + "   / hand")
    for name, body in job_bodies().items():
        assert hand_parse_job(body) == typed_parse_job(body)  # the same job from both
        scale = max(1, len(body) // 1000)  # a large body's parses take longer: fewer of them a round
        us = interleaved(options, body, rounds, max(1, number // scale))
        ratios = " ".join(f"{option} {us[option] / us['hand']:.2f}" for option in options if option != "hand")
        print(f"{name:<12} {len(body):>6} " + " ".join(f"{v:>16.2f}" for v in us.values()) + f"   {ratios}")


if __name__ == "__main__":
    main()
