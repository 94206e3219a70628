"""Error codes answered to callers, on the wire and over HTTP; the gateway maps each to an HTTP status
in one table (services/gateway/http/errors.py)."""

from __future__ import annotations

import reprlib
from enum import StrEnum
from typing import Any

_SHOW = reprlib.Repr()  # untrusted values quoted in errors: short, and no deep recursion
_SHOW.maxstring = _SHOW.maxother = _SHOW.maxlong = 60
_SHOW.maxlevel = 3


def shown(value: Any) -> str:
    """A short repr of an untrusted value, for error messages (which travel back in replies): at most
    80 characters, however deep or long the value."""
    text = _SHOW.repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


class ErrorCode(StrEnum):
    INVALID_REQUEST = "invalid_request"  # malformed or out-of-range input
    INPUT_TOO_LONG = "input_too_long"  # truncation off and an input exceeds the model limit
    INVALID_TOKENS = "invalid_tokens"  # token ids outside the vocabulary / bad packing
    MODEL_NOT_FOUND = "model_not_found"
    UNAUTHORIZED = "unauthorized"  # missing or unknown API key
    # a known API key asking for what it may not use (another key's table); a web page's Origin or a Host
    # the gateway is not served as (services/gateway/http/browser.py)
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"  # no such job
    NO_RESPONDERS = "no_responders"  # nobody serves the subject right now
    OVERLOADED = "overloaded"
    TIMEOUT = "timeout"  # the request's deadline passed
    INTERNAL = "internal"
    # the gateway's own, never on the wire
    PAYLOAD_TOO_LARGE = "payload_too_large"  # a request body over --max-body-bytes
    TOO_MANY_INPUTS = "too_many_inputs"  # more inputs than --max-inputs
    ROUTE_NOT_FOUND = "route_not_found"  # no route at the path
    METHOD_NOT_ALLOWED = "method_not_allowed"  # a route, but not for the method
    NOT_ACCEPTABLE = "not_acceptable"  # an Accept header naming no form the route answers in
    NOT_FINISHED = "not_finished"  # a job's results asked for before the job finished
    GONE = "gone"  # a job's results expired from the results stream
    CONFLICT = "conflict"  # a job id that names a job another request made
    UNSUPPORTED_MEDIA = "unsupported_media_type"  # a JSON route's body said to be something else


# how an input refused for its tokens ("has 302 tokens; the model's limit is 256") ends: in TEI's words,
# which the gateway puts in those of the route's own API (services/gateway/http/errors.py)
TRUNCATE_HINT = "(send truncate=true to cut it)"

# a reply from NATS naming one of these is someone else's mistake: it is read as INTERNAL
GATEWAY_ONLY = frozenset(
    {
        ErrorCode.PAYLOAD_TOO_LARGE,
        ErrorCode.TOO_MANY_INPUTS,
        ErrorCode.ROUTE_NOT_FOUND,
        ErrorCode.METHOD_NOT_ALLOWED,
        ErrorCode.NOT_ACCEPTABLE,
        ErrorCode.NOT_FINISHED,
        ErrorCode.GONE,
        ErrorCode.CONFLICT,
        ErrorCode.FORBIDDEN,
        ErrorCode.UNSUPPORTED_MEDIA,
    }
)


class ServiceError(Exception):
    """An error that is answered to the caller as a wire error: a code, a message and, for an error of
    one input, its ``row`` (its index in the request).

    The message of an input's error is said of that input ("has 302 tokens; ..."), and ``text`` names
    the input: "input 3 has 302 tokens; ...", or in the words of the API that numbers the rows
    (``noun``: "candidate 3 ...").
    """

    def __init__(self, code: ErrorCode, message: str, row: int | None = None, noun: str = "input") -> None:
        self.code = ErrorCode(code)
        self.message = message
        self.row = row
        self.noun = noun
        super().__init__(self.text())

    def text(self, name: str | None = None) -> str:
        """The message as a sentence: an input's error names the input, as ``name`` or by its row."""
        if self.row is None:
            return self.message
        return f"{name or f'{self.noun} {self.row}'} {self.message}"

    def at(self, row: int, noun: str | None = None) -> ServiceError:
        """The same error of an input numbered ``row``: a part's error, said of the request it is part of."""
        return ServiceError(self.code, self.message, row, noun or self.noun)

    def __repr__(self) -> str:
        return f"ServiceError({self.code.value!r}, {self.message!r}, row={self.row!r})"
