"""Errors answered over HTTP: one table from internal codes to HTTP status, and the body shapes
(OpenAI's on OpenAI routes, TEI's on TEI routes, Cohere's on Cohere routes)."""

from __future__ import annotations

import orjson
from starlette.responses import Response

from shared.errors import ErrorCode

# internal code -> (HTTP status, OpenAI error type, TEI error type)
STATUS: dict[ErrorCode, tuple[int, str, str]] = {
    ErrorCode.INVALID_REQUEST: (400, "invalid_request_error", "Validation"),
    ErrorCode.INPUT_TOO_LONG: (413, "invalid_request_error", "Validation"),
    ErrorCode.INVALID_TOKENS: (422, "invalid_request_error", "Validation"),
    ErrorCode.MODEL_NOT_FOUND: (404, "invalid_request_error", "Validation"),
    ErrorCode.NOT_FOUND: (404, "invalid_request_error", "Validation"),
    ErrorCode.UNAUTHORIZED: (401, "authentication_error", "Unauthorized"),
    ErrorCode.OVERLOADED: (429, "rate_limit_error", "Overloaded"),
    ErrorCode.INTERNAL: (500, "server_error", "Backend"),
    ErrorCode.NO_RESPONDERS: (503, "service_unavailable", "Unhealthy"),
    ErrorCode.TIMEOUT: (504, "timeout_error", "Backend"),
}

# routes answering in TEI's shape (routes in neither this set nor COHERE_PATHS answer in OpenAI's)
TEI_PATHS = frozenset({"/embed", "/embed_sparse", "/embed_all", "/tokenize", "/info", "/rerank", "/predict", "/similarity",
                       "/decode", "/", "/invocations", "/ping"})
# routes answering in Cohere's shape, ``{"message": ...}``; Cohere has no 413 and answers over-long
# inputs and bodies with 400, which its SDK raises as BadRequestError
COHERE_PATHS = frozenset({"/v1/embed", "/v2/embed", "/v2/rerank"})
COHERE_STATUS = {413: 400}


class ApiError(Exception):
    """An error for the client: an internal code (hence the status), a message, the parameter at fault."""

    def __init__(self, code: ErrorCode, message: str, param: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.status = status or STATUS[code][0]

    def response(self, path: str = "") -> Response:
        return error_response(path, self.status, self.message, self.code, self.param)


def error_response(path: str, status: int, message: str, code: ErrorCode | None, param: str | None = None) -> Response:
    _, openai_type, tei_type = STATUS.get(code, (status, "invalid_request_error" if status < 500 else "server_error", "Validation"))
    if path in TEI_PATHS:
        body: dict = {"error": message, "error_type": tei_type}
    elif path in COHERE_PATHS:
        body = {"message": message}
        status = COHERE_STATUS.get(status, status)
    else:
        body = {"error": {"message": message, "type": openai_type, "param": param, "code": code.value if code else None}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")
