"""Errors answered over HTTP: one table from internal codes to what each API answers (OpenAI's shape on
OpenAI routes and the gateway's own, TEI's on TEI routes, Cohere's on Cohere routes: routes.py)."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from starlette.responses import Response

from embedfleet.services.gateway.routes import Api, api_of
from embedfleet.shared.errors import TRUNCATE_HINT, ErrorCode, ServiceError


@dataclass(frozen=True, slots=True)
class Answer:
    """How one code is answered: its HTTP status, and each API's words for it."""

    status: int
    openai_type: str  # OpenAI's error.type
    tei_type: str  # TEI's error_type
    # Cohere has no 413: it answers over-long inputs and bodies with 400, which its SDK raises as BadRequestError
    cohere_status: int
    # OpenAI's error.code: the code's value, but the broader code for a limit, and none for starlette's routing
    openai_code: str | None


_C = ErrorCode
# fmt: off
TABLE: dict[ErrorCode, Answer] = {
    #                            status  OpenAI type              TEI type       Cohere  OpenAI code
    _C.INVALID_REQUEST:    Answer(400, "invalid_request_error", "Validation",   400, "invalid_request"),
    _C.INPUT_TOO_LONG:     Answer(413, "invalid_request_error", "Validation",   400, "input_too_long"),
    _C.PAYLOAD_TOO_LARGE:  Answer(413, "invalid_request_error", "Validation",   400, "invalid_request"),
    _C.TOO_MANY_INPUTS:    Answer(422, "invalid_request_error", "Validation",   422, "invalid_request"),
    _C.INVALID_TOKENS:     Answer(422, "invalid_request_error", "Validation",   422, "invalid_tokens"),
    _C.MODEL_NOT_FOUND:    Answer(404, "invalid_request_error", "Validation",   404, "model_not_found"),
    _C.NOT_FOUND:          Answer(404, "invalid_request_error", "Validation",   404, "not_found"),
    _C.ROUTE_NOT_FOUND:    Answer(404, "invalid_request_error", "Validation",   404, None),
    _C.METHOD_NOT_ALLOWED: Answer(405, "invalid_request_error", "Validation",   405, None),
    _C.NOT_ACCEPTABLE:     Answer(406, "invalid_request_error", "Validation",   406, "not_acceptable"),
    _C.NOT_FINISHED:       Answer(409, "invalid_request_error", "Validation",   409, "not_finished"),
    _C.CONFLICT:           Answer(409, "invalid_request_error", "Validation",   409, "conflict"),
    _C.UNSUPPORTED_MEDIA:  Answer(415, "invalid_request_error", "Validation",   415, "unsupported_media_type"),
    _C.GONE:               Answer(410, "invalid_request_error", "Validation",   410, "gone"),
    _C.UNAUTHORIZED:       Answer(401, "authentication_error",  "Unauthorized", 401, "unauthorized"),
    _C.FORBIDDEN:          Answer(403, "permission_error",      "Unauthorized", 403, "forbidden"),
    _C.OVERLOADED:         Answer(429, "rate_limit_error",      "Overloaded",   429, "overloaded"),
    _C.INTERNAL:           Answer(500, "server_error",          "Backend",      500, "internal"),
    _C.NO_RESPONDERS:      Answer(503, "service_unavailable",   "Unhealthy",    503, "no_responders"),
    _C.TIMEOUT:            Answer(504, "timeout_error",         "Backend",      504, "timeout"),
}
# fmt: on

# a route whose body asks for truncation in other words than TEI's: an over-long input's hint in its words
_CUT_IN_ITS_WORDS = {
    "/v1/embed": '(send truncate "END" or "START" to cut it)',
    "/v2/embed": '(send truncate "END" or "START" to cut it)',
    "/v1/rerank": '(send "truncate": true to cut it)',
}


class ApiError(Exception):
    """An error for the client: an internal code (hence the status), a message, the parameter at fault."""

    def __init__(self, code: ErrorCode, message: str, param: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.retry_after = retry_after  # seconds after which trying again may succeed (Retry-After), if known

    @classmethod
    def of(cls, error: ServiceError) -> ApiError:
        """A service's error as the client sees it: an input's error names it by its row in the request."""
        return cls(error.code, error.text())

    @property
    def status(self) -> int:
        return TABLE[self.code].status

    def response(self, path: str = "") -> Response:
        response = error_response(path, self.code, self.message, self.param)
        if self.retry_after is not None:
            response.headers["retry-after"] = str(self.retry_after)
        return response


def error_response(path: str, code: ErrorCode, message: str, param: str | None = None) -> Response:
    """The answer to ``code`` on ``path``, in the shape of the API the path belongs to (routes.py); an input
    refused for its tokens says how to cut it in the words of the route's body."""
    answer = TABLE[code]
    status = answer.status
    api = api_of(path)
    if code is ErrorCode.INPUT_TOO_LONG and path in _CUT_IN_ITS_WORDS and message.endswith(TRUNCATE_HINT):
        message = f"{message.removesuffix(TRUNCATE_HINT)}{_CUT_IN_ITS_WORDS[path]}"
    if api is Api.TEI:
        body: dict = {"error": message, "error_type": answer.tei_type}
    elif api is Api.COHERE:
        body = {"message": message}
        status = answer.cohere_status
    else:
        body = {"error": {"message": message, "type": answer.openai_type, "param": param, "code": answer.openai_code}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")
