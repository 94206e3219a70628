"""Every HTTP route of the gateway, declared once: its path and method, the ``Gateway`` method that
answers it, the API whose shape its errors take, and whether it embeds.

From this table are made: the starlette routes (app.py), the error shape of a path (http/errors.py), the
routes whose whole time is measured as a request stage (http/middleware.py), and /openapi.json is checked
against it (tests/gateway/test_routes.py). A path has one error shape, whatever its method.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Api(StrEnum):
    """Whose API a route answers for, hence the shape of its errors."""

    OPENAI = "openai"  # {"error": {"message", "type", "param", "code"}}
    TEI = "tei"  # {"error", "error_type"}
    COHERE = "cohere"  # {"message"}, and no 413 (Cohere answers 400)
    EMBEDFLEET = "embedfleet"  # the gateway's own routes (jobs, search, health, metrics): OpenAI's shape


@dataclass(frozen=True, slots=True)
class RouteSpec:
    path: str
    method: str
    handler: str  # the name of the Gateway method that answers it
    api: Api
    embeds: bool = False  # an embedding route: its whole time is observed as the stage "total"


_O, _T, _C, _E = Api.OPENAI, Api.TEI, Api.COHERE, Api.EMBEDFLEET

ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec("/v1/embeddings", "POST", "embeddings", _O, embeds=True),
    RouteSpec("/embeddings", "POST", "embeddings", _O, embeds=True),
    RouteSpec("/v1/models", "GET", "models", _O),
    # Cohere's and Jina's request and answer, OpenAI's errors (what those clients read)
    RouteSpec("/v1/rerank", "POST", "rerank_cohere", _O),
    RouteSpec("/v1/search", "POST", "search", _E),
    RouteSpec("/v1/jobs", "POST", "create_job", _E),
    RouteSpec("/v1/jobs", "GET", "list_jobs", _E),
    RouteSpec("/v1/jobs/{job}", "GET", "job_state", _E),
    RouteSpec("/v1/jobs/{job}", "DELETE", "cancel_job", _E),
    RouteSpec("/v1/jobs/{job}/results", "GET", "job_vectors", _E),
    RouteSpec("/embed", "POST", "embed", _T, embeds=True),
    RouteSpec("/embed_sparse", "POST", "embed_sparse", _T),
    RouteSpec("/embed_all", "POST", "embed_all", _T),
    RouteSpec("/tokenize", "POST", "tokenize", _T),
    RouteSpec("/rerank", "POST", "rerank_tei", _T),
    RouteSpec("/predict", "POST", "predict", _T),
    RouteSpec("/similarity", "POST", "similarity", _T),
    RouteSpec("/decode", "POST", "decode", _T),
    RouteSpec("/", "POST", "root", _T),  # by the model's kind, as TEI's POST /
    RouteSpec("/invocations", "POST", "root", _T),  # SageMaker's path for it
    RouteSpec("/", "GET", "health", _T),
    RouteSpec("/ping", "GET", "health", _T),
    RouteSpec("/info", "GET", "info", _T),
    RouteSpec("/v1/embed", "POST", "cohere_embed_v1", _C, embeds=True),
    RouteSpec("/v2/embed", "POST", "cohere_embed_v2", _C, embeds=True),
    RouteSpec("/v2/rerank", "POST", "rerank_cohere_v2", _C),
    RouteSpec("/health", "GET", "health", _E),
    RouteSpec("/metrics", "GET", "prometheus", _E),
    RouteSpec("/openapi.json", "GET", "openapi", _E),
)

PATHS = frozenset(route.path for route in ROUTES)
EMBED_PATHS = frozenset(route.path for route in ROUTES if route.embeds)
_API_OF = {route.path: route.api for route in ROUTES}


def api_of(path: str) -> Api:
    """The API whose shape ``path``'s errors take (a path no route has: OpenAI's)."""
    return _API_OF.get(path, Api.OPENAI)
