"""The CPU of parsing a /v1/embeddings body: the route's typed model against the hand-written parser and
msgspec, in one run; with --route embed, TEI's /embed body, typed model against its hand-written parser.

    python -m bench.body_parsing            # msgspec's row needs msgspec (pip install msgspec)
    python -m bench.body_parsing --route embed

Per body: microseconds for one parse into the route's EmbeddingsRequest, best of several rounds, and
each option's time over the hand-written parser's:
- hand: the parser the route had, orjson and a check a field (inputs.py's helpers, which the TEI and
  Cohere routes still use);
- pydantic: the route's parse now, EmbeddingsBody.model_validate_json then the gateway's limits;
- pydantic model: model_validate_json alone, what the typed model costs by itself;
- msgspec: a msgspec Struct with the same bounds, then the same limits. msgspec takes one array type in
  a union, so 'input' is a str or a list checked by hand as before.
The bodies: one query (the hot path), eight inputs, and every field set. docs/performance.md
("Parsing a request body") records runs.
For /embed (--route embed): hand is the parser the route had, pydantic tei_api.parse_embed (EmbedBody),
pydantic model EmbedBody's validation alone; the same three kinds of body.
"""

import argparse
import math
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

import orjson

from embedfleet.services.gateway.chunking import parse_text_chunking
from embedfleet.services.gateway.errors import ApiError
from embedfleet.services.gateway.inputs import (
    Limits,
    embedding_form,
    json_object,
    name_field,
    optional,
    parse_inputs,
    positive_dimensions,
)
from embedfleet.services.gateway.openai_api import EmbeddingsRequest, parse_embeddings_request
from embedfleet.services.gateway.openai_body import EmbeddingsBody
from embedfleet.services.gateway.tei_api import EmbedRequest, parse_embed
from embedfleet.services.gateway.tei_body import EmbedBody
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.protocol import MAX_DIMENSION, EmbedOptions
from embedfleet.shared.text_chunks import ChunkSpec
from embedfleet.shared.vector_forms import FORMS, form_named

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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30, help="best of this many rounds")
    ap.add_argument("--number", type=int, default=2000, help="parses a round")
    ap.add_argument("--route", choices=("embeddings", "embed"), default="embeddings", help="whose body")
    args = ap.parse_args(argv)
    if args.route == "embed":
        options: dict[str, Callable[[bytes], object]] = {
            "hand": lambda b: tei_hand_parse(b, LIMITS),
            "pydantic": lambda b: parse_embed(b, LIMITS),
            "pydantic model": EmbedBody.model_validate_json,
        }
        route_bodies = tei_bodies()
    else:
        options = {
            "hand": lambda b: hand_parse(b, LIMITS),
            "pydantic": lambda b: parse_embeddings_request(b, LIMITS),
            "pydantic model": EmbeddingsBody.model_validate_json,
        }
        with_msgspec = msgspec_parser()
        if with_msgspec is not None:
            options["msgspec"] = lambda b: with_msgspec(b, LIMITS)
        route_bodies = bodies()
    print(f"{'body':<12} {'bytes':>5} " + " ".join(f"{name + ' µs':>16}" for name in options) + "   / hand")
    for name, body in route_bodies.items():
        for parse in options.values():
            parse(body)  # each parses every body (a refusal would raise here)
        us = interleaved(options, body, args.rounds, args.number)
        ratios = " ".join(f"{option} {us[option] / us['hand']:.2f}" for option in options if option != "hand")
        print(f"{name:<12} {len(body):>5} " + " ".join(f"{v:>16.2f}" for v in us.values()) + f"   {ratios}")


if __name__ == "__main__":
    main()
