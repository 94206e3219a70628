"""A typed body read (``read_body``), and its validation error as the API's own: the first fault, the
field it names, a clear message.

pydantic reports each fault as a location (field names, list indices, union tags) and a type; the
client sees ``'chunking.size' must be an integer, got '8'`` (or ``'input[1]' must be a string, got null``)
with ``param`` the field's dotted path ('chunking.size'; an item of a list is its list: 'input'), in the
route's error shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, Tag, ValidationError
from pydantic_core import ErrorDetails

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import json_type, not_a_token
from embedfleet.shared.errors import ErrorCode

Body = TypeVar("Body", bound=BaseModel)


def read_body(model: type[Body], body: bytes, fault: Callable[[list[ErrorDetails]], ApiError] | None = None) -> Body:
    """``body`` as ``model``; otherwise its first fault as ``fault`` words it (default: ``fault_error``)."""
    try:
        # validate_json without model_validate_json's wrapper: a third of a microsecond off the hot path
        # (bench/body_parsing.py)
        return model.__pydantic_validator__.validate_json(body)
    except ValidationError as exc:
        raise (fault or fault_error)(exc.errors(include_url=False)) from None


def member(name: str) -> Tag:
    """The tag of a discriminated union's member: in an error's location, not a field, so left out."""
    return Tag(f"<{name}>")


_EMPTY = {"string_too_short": "an empty string", "too_short": "an empty list"}
_LONG = ("string_too_long", "too_long")
# what a value of the wrong type should have been, by pydantic's error type
_KINDS = {
    "string_type": "a string",
    "int_type": "an integer",
    "bool_type": "true or false",
    "list_type": "a list",
    "model_type": "an object",
    "dict_type": "an object",
    "float_type": "a number",
}


def fault_error(errors: list[ErrorDetails], code: ErrorCode = ErrorCode.INVALID_REQUEST) -> ApiError:
    """The first of ``errors`` (a ValidationError's, in the body's order) as an ApiError of ``code``;
    an object's unknown keys all together."""
    err = errors[0]
    kind, loc, ctx = err["type"], err["loc"], err.get("ctx", {})
    if kind == "json_invalid":
        return ApiError(code, f"request body is not valid JSON: {ctx.get('error', err['msg'])}")
    if not loc:
        return ApiError(code, "request body must be a JSON object")
    fields = _fields(loc)
    names = [part for part in fields if isinstance(part, str)]
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in fields)[1:]
    param = ".".join(names)
    if kind == "missing":
        return ApiError(code, f"'{where}' is required", param)
    if kind in _EMPTY:
        return ApiError(code, f"'{where}' must not be {_EMPTY[kind]}", param)
    if kind in _LONG:  # a string's characters, a list's items or an object's fields past a bound
        unit = "characters" if kind == "string_too_long" else "fields" if isinstance(err["input"], dict) else "items"
        return ApiError(code, f"'{where}' has {len(err['input'])} {unit}; the limit is {ctx['max_length']}", param)
    if kind == "extra_forbidden":
        keys = [e["loc"][-1] for e in errors if e["type"] == kind and e["loc"][:-1] == loc[:-1]]
        parent = where.rpartition(".")[0]
        return ApiError(code, f"'{parent}' has unknown keys {', '.join(map(repr, keys))}", ".".join(names[:-1]))
    return ApiError(code, f"'{where}' must be {_expected(kind, ctx, err['msg'])}, got {_shown(err['input'])}", param)


def _fields(loc: tuple[int | str, ...]) -> list[int | str]:
    """The location without union tags (``member``'s, and pydantic's own such as 'list[str]')."""
    return [part for part in loc if isinstance(part, int) or (part.isidentifier() and part not in _TYPES)]


_TYPES = {"str", "int", "bool", "float", "list", "dict"}  # pydantic's tags of a plain union's members


def _expected(kind: str, ctx: dict[str, Any], msg: str) -> str:
    if kind in _KINDS:
        return _KINDS[kind]
    if kind == "literal_error":  # pydantic's "'a', 'b' or 'c'"
        return f"one of {ctx['expected']}" if ", " in ctx["expected"] else str(ctx["expected"])
    if kind == "greater_than_equal":
        return f"at least {ctx['ge']}"
    if kind == "greater_than":
        return f"greater than {ctx['gt']}"
    if kind == "less_than_equal":
        return f"at most {ctx['le']}"
    return msg.removeprefix("Input should be ").removeprefix("Value error, ")


def _shown(value: Any) -> str:
    """The offending value: short scalars as they are, anything else by its JSON type."""
    if isinstance(value, bool | int | float) or (isinstance(value, str) and len(value) <= 32):
        return repr(value) if not isinstance(value, bool) else str(value).lower()
    return json_type(value)


def input_fault(errors: list[ErrorDetails], field: str) -> ApiError:
    """A fault in the inputs ``field`` (typed as openai_body's Input: a text, texts, token IDs or token-ID
    lists) as the tokenizer words it: 422 for a value that is no token ID; every other fault as
    ``fault_error`` words it."""
    err = errors[0]
    loc = err["loc"]
    if loc[:2] == (field, "<tokens>") and len(loc) == 3:
        return not_a_token(field, err["input"])
    if loc[:2] == (field, "<token_lists>") and len(loc) == 4:
        return not_a_token(f"{field}[{loc[2]}]", err["input"])
    if loc[:2] == (field, "<token_lists>") and len(loc) == 3:
        return ApiError(ErrorCode.INVALID_REQUEST, f"'{field}[{loc[2]}]' must be a non-empty list of token IDs", field)
    return fault_error(errors)
