"""Binary answers for clients that want them: raw little-endian rows, or a msgpack map.

``Accept: application/octet-stream`` gets the rows as ``<f4`` bytes (row count, dimension and dtype
in headers); ``Accept: application/msgpack`` gets ``{model, rows, dim, dtype, data, usage}`` with
``data`` the same bytes. Anything else gets JSON.
"""

from __future__ import annotations

import msgpack
import numpy as np
from starlette.responses import Response

OCTET = "application/octet-stream"
MSGPACK = "application/msgpack"
_MSGPACK_ALIASES = (MSGPACK, "application/x-msgpack", "application/vnd.msgpack")


def negotiate(accept: str | None) -> str:
    """'octet', 'msgpack' or 'json', from an Accept header (first listed binary type wins)."""
    for part in (accept or "").lower().split(","):
        media = part.split(";")[0].strip()
        if media == OCTET:
            return "octet"
        if media in _MSGPACK_ALIASES:
            return "msgpack"
    return "json"


def binary_response(kind: str, model: str, vectors: np.ndarray, tokens: int, headers: dict[str, str]) -> Response:
    rows = np.ascontiguousarray(vectors, dtype="<f4")
    if kind == "octet":
        meta = {"x-embedding-rows": str(rows.shape[0]), "x-embedding-dim": str(rows.shape[1]),
                "x-embedding-dtype": "float32-le", "x-prompt-tokens": str(tokens)}
        return Response(rows.tobytes(), media_type=OCTET, headers={**headers, **meta})
    body = msgpack.packb(
        {
            "object": "list",
            "model": model,
            "rows": rows.shape[0],
            "dim": rows.shape[1],
            "dtype": "<f4",
            "data": rows.tobytes(),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        },
        use_bin_type=True,
    )
    return Response(body, media_type=MSGPACK, headers=headers)
