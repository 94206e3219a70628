"""What each route answers in, so that an Accept taking none of it is refused (406, in the route's
error shape, naming what it answers) before the route reads its body or holds a slot.

JSON for every route of routes.py, but: the embedding routes' binary answers (services/gateway/http/formats.py;
POST / and /invocations run /embed for an embedder), /metrics' Prometheus text, and a job's results,
whose route weighs NDJSON against Parquet itself (services/gateway/jobs/results.py).
"""

from __future__ import annotations

import re

from starlette.routing import compile_path

from embedfleet.services.gateway.http.accept import Offer, chosen, named
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.http.formats import BINARY, JSON_ONLY
from embedfleet.services.gateway.routes import ROUTES, RouteSpec
from embedfleet.shared.errors import ErrorCode

# (method, path) -> what it answers in besides JSON alone; None: the route negotiates itself
_ANSWERS: dict[tuple[str, str], tuple[Offer, ...] | None] = {
    **{("POST", path): BINARY for path in ("/v1/embeddings", "/embeddings", "/embed", "/", "/invocations")},
    ("GET", "/metrics"): (Offer("text/plain", "text"),),
    ("GET", "/v1/jobs/{job}/results"): None,
}


class RouteMedia:
    """The media types of ``routes``, by method and path (a path parameter matched as starlette matches it)."""

    def __init__(self, routes: tuple[RouteSpec, ...] = ROUTES) -> None:
        self._exact: dict[tuple[str, str], tuple[Offer, ...] | None] = {}
        self._templated: list[tuple[str, re.Pattern[str], tuple[Offer, ...] | None]] = []
        for route in routes:
            offers = _ANSWERS.get((route.method, route.path), JSON_ONLY)
            if "{" in route.path:
                self._templated.append((route.method, compile_path(route.path)[0], offers))
            else:
                self._exact[(route.method, route.path)] = offers

    def refusal(self, method: str, path: str, accept: str | None) -> ApiError | None:
        """A 406 for a request whose ``accept`` takes nothing its route answers in; None: it takes one, or
        the route weighs it itself, or no route answers the method and path (404 and 405 come first)."""
        if accept is None:
            return None
        offers = self._offers(method, path)
        if offers is None or chosen(accept, offers) is not None:
            return None
        return ApiError(
            ErrorCode.NOT_ACCEPTABLE,
            f"{method} {path} answers {named(offers)}; the request's Accept takes none of them",
            "accept",
        )

    def _offers(self, method: str, path: str) -> tuple[Offer, ...] | None:
        if (method, path) in self._exact:
            return self._exact[(method, path)]
        for route_method, pattern, offers in self._templated:
            if route_method == method and pattern.match(path):
                return offers
        return None
