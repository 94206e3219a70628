"""The routes without path parameters, called straight from the gateway's middleware by (method, path).

starlette's own stack costs a request several ASGI layers (ServerErrorMiddleware, ExceptionMiddleware
and the route's exception wrapper, each wrapping ``send``), and its router tries the routes one by one:
about as much CPU as the rest of a query's HTTP handling. Here a request whose method and path name a
route exactly runs its endpoint at once, its exceptions answered by the same handlers starlette is given
(looked up by the exception's class, as starlette does); every other request (a path parameter, an
unknown path or method, the lifespan) goes through starlette as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]
Handler = Callable[[Request, Exception], Awaitable[Response]]


class Endpoints:
    """``routes``' endpoints by (method, path), but those with path parameters; ``handlers``: exception
    class -> its answer, the app's ``exception_handlers``. A handler for ``Exception`` (the unexpected)
    answers, then the exception goes on up, as starlette's ServerErrorMiddleware lets it (the server logs it)."""

    def __init__(self, routes: list[Route], handlers: Mapping[type[Exception], Handler]) -> None:
        self._table: dict[tuple[str, str], Endpoint] = {}
        for route in routes:
            if route.param_convertors:
                continue
            for method in route.methods or ():
                self._table.setdefault((method, route.path), route.endpoint)
        self._handlers = dict(handlers)

    def get(self, method: str, path: str) -> Endpoint | None:
        return self._table.get((method, path))

    async def run(self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except ClientDisconnect:
            raise  # no answer to give: the caller counts the request as disconnected
        except Exception as exc:
            kind = next((k for k in type(exc).__mro__ if k in self._handlers), None)
            if kind is None:
                raise
            await (await self._handlers[kind](request, exc))(scope, receive, send)
            if kind is Exception:
                raise
            return
        await response(scope, receive, send)
