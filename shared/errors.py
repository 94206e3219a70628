"""Error codes that travel on the wire; the gateway maps each to an HTTP status in one table."""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    INVALID_REQUEST = "invalid_request"  # malformed or out-of-range input
    INPUT_TOO_LONG = "input_too_long"  # truncation off and an input exceeds the model limit
    INVALID_TOKENS = "invalid_tokens"  # token ids outside the vocabulary / bad packing
    MODEL_NOT_FOUND = "model_not_found"
    UNAUTHORIZED = "unauthorized"  # missing or unknown API key
    NOT_FOUND = "not_found"  # no such job
    NO_RESPONDERS = "no_responders"  # nobody serves the subject right now
    OVERLOADED = "overloaded"
    TIMEOUT = "timeout"  # the request's deadline passed
    INTERNAL = "internal"


class ServiceError(Exception):
    """An error that is answered to the caller as a wire error (code + message)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message

    def __repr__(self) -> str:
        return f"ServiceError({self.code.value!r}, {self.message!r})"
