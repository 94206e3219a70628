"""Errors answered over HTTP: one table from wire error codes to HTTP status, and the body shapes."""

from __future__ import annotations

from starlette.responses import Response

import orjson

from shared.errors import ErrorCode

# wire error code -> (HTTP status, OpenAI error type)
STATUS: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.INVALID_REQUEST: (400, "invalid_request_error"),
    ErrorCode.INPUT_TOO_LONG: (413, "invalid_request_error"),
    ErrorCode.INVALID_TOKENS: (422, "invalid_request_error"),
    ErrorCode.MODEL_NOT_FOUND: (404, "invalid_request_error"),
    ErrorCode.OVERLOADED: (429, "rate_limit_error"),
    ErrorCode.INTERNAL: (500, "server_error"),
    ErrorCode.NO_RESPONDERS: (503, "service_unavailable"),
    ErrorCode.TIMEOUT: (504, "timeout_error"),
}


class ApiError(Exception):
    """An error for the client: status and OpenAI-shaped body."""

    def __init__(self, code: ErrorCode, message: str, param: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.status = status or STATUS[code][0]

    def response(self) -> Response:
        return openai_error(self.status, self.message, STATUS[self.code][1], self.param, self.code.value)


def openai_error(status: int, message: str, type_: str, param: str | None, code: str | None) -> Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")
