"""Binary answers for clients that want them: raw little-endian rows, or a msgpack map.

Rows are in the request's ``embedding_type`` (shared/vectors/forms.py): float32 unless asked otherwise.
``Accept: application/octet-stream`` gets the rows' bytes (row count, components, form and bytes per
row in headers); ``Accept: application/msgpack`` gets ``{model, rows, dim, shape, dtype,
embedding_type, data, usage}`` with ``data`` the same bytes, ``dtype`` numpy's name of one element and
``shape`` the stored array's (a bit-packed row holds ceil(dim / 8) bytes). JSON is the default (no
Accept, ``*/*``); the type of the highest weight is answered (services/gateway/http/accept.py), and an
Accept that takes none of these is refused before the route runs (services/gateway/http/route_media.py).
"""

from __future__ import annotations

import msgpack
import numpy as np
import orjson
from starlette.responses import Response

from embedfleet.services.gateway.http.accept import Offer, chosen
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.nats.embed_client import EmbedOutcome
from embedfleet.shared.vectors.forms import FORMS, OCTET_DTYPES

JSON = "application/json"
OCTET = "application/octet-stream"
MSGPACK = "application/msgpack"
JSON_ONLY = (Offer(JSON, "json"),)
# what an embedding route answers in, its default first
BINARY = (
    *JSON_ONLY,
    Offer(OCTET, "octet"),
    *(Offer(media, "msgpack") for media in (MSGPACK, "application/x-msgpack", "application/vnd.msgpack")),
)


def json_response(body: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``body`` as JSON (orjson), the answer of every route that answers a plain object."""
    return Response(orjson.dumps(body), status_code=status, media_type=JSON, headers=headers)


def negotiate(accept: str | None) -> str:
    """'json', 'octet' or 'msgpack', from an Accept header (the route refused one taking none of them)."""
    offer = chosen(accept, BINARY)
    return "json" if offer is None else offer.kind


def rows_form(asked: str, answered: str) -> str:
    """The form of rows that came back in form ``answered`` for a request that asked for ``asked``: a
    worker that ignores the request's dtype (an older one) is an error, not rows labelled as something
    they are not."""
    if answered != asked:
        raise ApiError(
            ErrorCode.INTERNAL,
            f"a worker answered {answered} rows to a request for {asked}: is it older than the gateway?",
        )
    return answered


def binary_response(
    kind: str,
    model: str,
    vectors: np.ndarray,
    tokens: int,
    headers: dict[str, str],
    form: str = "float32",
    dim: int | None = None,
) -> Response:
    """``vectors``: [rows, width(dim)] of the form's element type; ``dim``: components per row (None: the
    row width, which it is for every form but the bit-packed ones)."""
    rows = np.ascontiguousarray(vectors, dtype=FORMS[form].dtype)
    dim = rows.shape[1] if dim is None else dim
    assert rows.shape[1] == FORMS[form].width(dim), (form, dim, rows.shape)
    if kind == "octet":
        meta = {
            "x-embedding-rows": str(rows.shape[0]),
            "x-embedding-dim": str(dim),
            "x-embedding-dtype": OCTET_DTYPES[form],
            "x-embedding-row-bytes": str(rows.shape[1] * rows.itemsize),
            "x-prompt-tokens": str(tokens),
        }
        return Response(rows.tobytes(), media_type=OCTET, headers={**headers, **meta})
    body = msgpack.packb(
        {
            "object": "list",
            "model": model,
            "rows": rows.shape[0],
            "dim": dim,
            "shape": list(rows.shape),
            "dtype": rows.dtype.str,  # "<f4", "<f2", "|i1" (int8, binary), "|u1" (uint8, ubinary)
            "embedding_type": form,
            "data": rows.tobytes(),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        },
        use_bin_type=True,
    )
    return Response(body, media_type=MSGPACK, headers=headers)


def binary_answer(
    accept: str | None, model: str, outcome: EmbedOutcome, form: str, chunks: list | None, headers: dict[str, str]
) -> Response | None:
    """The rows as bytes when the Accept header asks for them (None: it asks for JSON); chunk rows are
    refused so, their offsets having no room there."""
    kind = negotiate(accept)
    if kind == "json":
        return None
    if chunks is not None:
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            "a binary answer has no room for the chunks' offsets: ask "
            "for JSON, or for 'chunking.return' 'mean' (a vector per input)",
            "chunking",
        )
    return binary_response(kind, model, outcome.vectors, outcome.tokens, headers, form, outcome.dim)
