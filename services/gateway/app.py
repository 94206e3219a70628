"""The gateway's HTTP application: routes, NATS lifecycle, error handling."""

from __future__ import annotations

import contextlib
import logging
from typing import AsyncIterator

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from shared.client import EmbedClient
from shared.errors import ErrorCode, ServiceError
from shared.lifecycle import connect, register
from shared.model_dir import same_model
from shared.protocol import EmbedOptions
from services.gateway.config import GatewayConfig
from services.gateway.discovery import Discovery
from services.gateway.errors import ApiError, openai_error
from services.gateway.openai_api import parse_embeddings_request, render_embeddings

log = logging.getLogger("embedfleet.gateway")


def json_response(body: object, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


class Gateway:
    """State behind the routes: the NATS connection, the embed client and fleet discovery."""

    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        self.nc = None
        self.client: EmbedClient | None = None
        self.discovery: Discovery | None = None
        self._micro = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.nc = await connect(self.cfg.nats, "embedfleet-gateway")
        self.client = EmbedClient(self.nc, self.cfg.nats.subjects)
        await self.client.start()
        self.discovery = Discovery(self.nc, self.cfg.nats.subjects.prefix, self.cfg.discovery_wait, self.cfg.discovery_interval)
        self._micro = await register(self.nc, self.cfg.nats.subjects, "gateway", "HTTP gateway", {"port": str(self.cfg.port)})
        log.info("gateway on http://%s:%d (nats %s)", self.cfg.host, self.cfg.port, self.cfg.nats.url)
        try:
            yield
        finally:
            await self._micro.stop()
            await self.client.stop()
            await self.nc.drain()

    async def resolve_model(self, requested: str) -> str:
        """The served id that ``requested`` names; ApiError when nobody serves it."""
        view = await self.discovery.view()
        for fresh in (False, True):
            if fresh:
                view = await self.discovery.refresh()
            for model in view.models:
                if same_model(requested, model):
                    return model
        if not view.models:
            raise ApiError(ErrorCode.NO_RESPONDERS, "no tokenizer and worker are serving any model right now")
        raise ApiError(
            ErrorCode.MODEL_NOT_FOUND,
            f"model {requested!r} is not served here; available: {', '.join(view.models)}",
            "model",
        )

    async def embeddings(self, request: Request) -> Response:
        body = await _read_body(request, self.cfg.max_body_bytes)
        req = parse_embeddings_request(body, self.cfg.max_inputs)
        model = await self.resolve_model(req.model)
        view = await self.discovery.view()
        dim = int(view.workers.get(model, {}).get("dim", 0))
        if req.dimensions is not None and dim and req.dimensions > dim:
            raise ApiError(ErrorCode.INVALID_REQUEST, f"'dimensions' {req.dimensions} exceeds the model's {dim}", "dimensions")
        try:
            outcome = await self.client.embed(
                model, req.texts, EmbedOptions(dimensions=req.dimensions), self.cfg.request_timeout
            )
        except ServiceError as exc:
            raise ApiError(exc.code, exc.message) from None
        return Response(
            render_embeddings(model, outcome.vectors, outcome.tokens, req.encoding_format),
            media_type="application/json",
        )

    async def models(self, request: Request) -> Response:
        view = await self.discovery.view()
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "embedfleet"} for m in view.models]
        return json_response({"object": "list", "data": data})

    async def health(self, request: Request) -> Response:
        view = await self.discovery.refresh(until_ready=True)
        if view.models:
            return json_response({"status": "ok", "models": view.models})
        return json_response(
            {
                "status": "unavailable",
                "tokenizers": sorted(view.tokenizers),
                "workers": sorted(view.workers),
            },
            status=503,
        )


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"request body is over the {limit} byte limit", status=413)
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise ApiError(ErrorCode.INVALID_REQUEST, f"request body is over the {limit} byte limit", status=413)
    return bytes(body)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return openai_error(exc.status_code, str(exc.detail), "invalid_request_error", None, None)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return openai_error(500, "internal error", "server_error", None, ErrorCode.INTERNAL.value)


def create_app(cfg: GatewayConfig) -> Starlette:
    gw = Gateway(cfg)
    routes = [
        Route("/v1/embeddings", gw.embeddings, methods=["POST"]),
        Route("/embeddings", gw.embeddings, methods=["POST"]),
        Route("/v1/models", gw.models, methods=["GET"]),
        Route("/health", gw.health, methods=["GET"]),
    ]
    return Starlette(
        routes=routes,
        lifespan=gw.lifespan,
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected},
    )


def serve(cfg: GatewayConfig, log_level: str) -> None:
    import uvicorn

    uvicorn.run(
        create_app(cfg),
        host=cfg.host,
        port=cfg.port,
        log_level=log_level,
        access_log=log_level == "debug",
        timeout_graceful_shutdown=30,
    )
