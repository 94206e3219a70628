"""Scorer service: RerankRequest in (queue group); candidates embedded through the fleet, ranked here."""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.micro.service import Service

from embedfleet.services.scorer.config import ScorerConfig
from embedfleet.services.scorer.metrics import ScorerMetrics
from embedfleet.services.scorer.scoring import cosine_rank, rank, sigmoid
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.nats.embed_client import EmbedClient, part_of
from embedfleet.shared.nats.fleet import FleetWatch
from embedfleet.shared.nats.lifecycle import register
from embedfleet.shared.nats.subjects import SCORER_QUEUE, model_token
from embedfleet.shared.observability.metrics_server import MetricsServer, serve_metrics
from embedfleet.shared.observability.tracing import Tracer, bind, from_headers
from embedfleet.shared.protocol import (
    EmbedOptions,
    ErrorReply,
    ProtocolError,
    RerankRequest,
    RerankResult,
    decode_as,
    encode,
)

log = logging.getLogger("embedfleet.scorer")


class ScorerService:
    def __init__(self, nc: Client, cfg: ScorerConfig) -> None:
        self._nc = nc
        self._cfg = cfg
        # the tokenizers and workers it sends candidates to: rows a dead one held are sent again
        self._fleet = FleetWatch(
            nc,
            cfg.nats.subjects.prefix,
            wait=cfg.discovery_wait,
            interval=cfg.discovery_interval,
            busy=lambda: self._client.in_flight > 0,
        )
        self._client = EmbedClient(nc, cfg.nats.subjects, fleet=self._fleet)
        self._fleet.on_lost(self._client.resend_missing)
        self._slots = asyncio.Semaphore(cfg.max_concurrency)
        self._tasks: set[asyncio.Task] = set()
        self._sub: Subscription | None = None
        self._micro: Service | None = None
        self.metrics = ScorerMetrics(cfg.model.id, _kind(cfg), lambda: len(self._tasks))
        self._exporter: MetricsServer | None = None
        self._tracer = Tracer("scorer", cfg.tracing)

    async def start(self) -> None:
        self._exporter = serve_metrics(self.metrics.registry, self._cfg.metrics)
        await self._client.start()
        await self._fleet.start()
        subject = self._cfg.nats.subjects.rerank(self._cfg.model.id)
        self._sub = await self._nc.subscribe(subject, queue=SCORER_QUEUE, cb=self._on_request)
        self._micro = await register(
            self._nc,
            self._cfg.nats.subjects,
            "scorer",
            "rerank: cross-encoder scores or cosine similarity",
            {"model": self._cfg.model.id, "kind": _kind(self._cfg)},
        )
        log.info("serving rerank for %s on %s", self._cfg.model.id, subject)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.drain()
            self._sub = None
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._fleet.stop()
        await self._client.stop()
        if self._micro is not None:
            await self._micro.stop()
            self._micro = None
        if self._exporter is not None:
            self._exporter.close()
        self._tracer.shutdown()

    async def _on_request(self, msg: Msg) -> None:
        # the subscription delivers one message at a time: score concurrently, bounded by the slots
        await self._slots.acquire()
        task = asyncio.create_task(self._handle(msg))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _handle(self, msg: Msg) -> None:
        if not msg.reply:
            return
        request_id = ""
        error: ServiceError | None = None
        reply: RerankResult | ErrorReply
        # a task of its own: the candidates' embed requests sent from here are this span's children
        span = self._tracer.start("scorer rerank", from_headers(msg.headers), "consumer")
        bind(span.context, "")
        try:
            request = decode_as(msg.data, RerankRequest)
            request_id = request.id
            bind(span.context, request_id)
            span.set(request_id=request_id, model=request.model, candidates=request.count)
            with self.metrics.rerank(request.count):
                reply = await self._rank(request)
        except ProtocolError as exc:
            error = ServiceError(ErrorCode.INVALID_REQUEST, str(exc))
        except ServiceError as exc:
            error = exc
        except Exception:
            log.exception("rerank %s failed", request_id)
            error = ServiceError(ErrorCode.INTERNAL, "scorer error")
        if error is not None:
            span.error(error.code.value, error.text())
            reply = ErrorReply(request_id, error.code, error.message, error.row)
        span.end()
        self.metrics.answered(reply)
        payload = encode(reply)
        if len(payload) > self._nc.max_payload:  # the ranked texts asked back can outgrow a message
            payload = encode(
                ErrorReply(
                    request_id,
                    ErrorCode.INVALID_REQUEST,
                    f"the answer takes {len(payload)} bytes; the NATS limit is "
                    f"{self._nc.max_payload}: ask for fewer texts back (top_n)",
                )
            )
        await self._nc.publish(msg.reply, payload)

    async def _rank(self, request: RerankRequest) -> RerankResult:
        if model_token(request.model) != model_token(self._cfg.model.id):
            raise ServiceError(
                ErrorCode.MODEL_NOT_FOUND, f"this subject serves {self._cfg.model.id}, not {request.model[:200]!r}"
            )
        if request.count == 0:
            return RerankResult(request.id, indices=np.zeros(0, "<i4"), scores=np.zeros(0, "<f4"))
        remaining = request.deadline - time.time()  # one deadline for the whole rerank
        if remaining <= 0:
            raise ServiceError(ErrorCode.TIMEOUT, "deadline passed before scoring")
        model = self._cfg.model
        options = EmbedOptions(normalize=not model.scores, truncate=request.truncate)
        if model.scores:
            if request.vectors is not None:
                raise ServiceError(
                    ErrorCode.INVALID_REQUEST, f"{model.id} is a cross-encoder: send candidates as texts"
                )
            logits = (await self._in_parts(request.texts, remaining, options, query=request.query))[:, 0]
            # the score CrossEncoder.predict gives by default (sigmoid unless the folder saved Identity)
            plain = request.raw_scores or model.score_activation == "identity"
            indices, scores = rank(logits if plain else sigmoid(logits), request.top_n)
            return _answer(request, indices, scores)
        query_part = self._client.embed(model.id, [request.query], options, remaining)
        if request.vectors is not None:
            query = (await _query(query_part)).vectors[0]
            if request.vectors.shape[1] != len(query):
                raise ServiceError(
                    ErrorCode.INVALID_REQUEST,
                    f"candidate vectors have {request.vectors.shape[1]} dimensions; {model.id} makes {len(query)}",
                )
            candidates = request.vectors
        else:
            query_outcome, candidates = await asyncio.gather(
                _query(query_part), self._in_parts(request.texts, remaining, options)
            )
            query = query_outcome.vectors[0]
        indices, scores = cosine_rank(query, candidates, request.top_n)
        return _answer(request, indices, scores)

    async def _in_parts(
        self, texts: list[str], remaining: float, options: EmbedOptions, query: str | None = None
    ) -> np.ndarray:
        """Embed (or, with ``query``, score as pairs) the candidates in parts of at most --split, all at
        once: the tokenizers route each part to the worker that will finish it first. Rows in order."""
        size = self._cfg.split
        parts = []
        for start in range(0, len(texts), size):
            chunk = texts[start : start + size]
            if query is None:
                call = self._client.embed(self._cfg.model.id, chunk, options, remaining)
            else:
                call = self._client.embed(self._cfg.model.id, [], options, remaining, pairs=[(query, t) for t in chunk])
            parts.append(part_of(call, range(start, start + len(chunk)), "candidate"))
        return np.concatenate([outcome.vectors for outcome in await asyncio.gather(*parts)])


def _kind(cfg: ScorerConfig) -> str:
    return "cross-encoder" if cfg.model.scores else "bi-encoder"


def _answer(request: RerankRequest, indices: np.ndarray, scores: np.ndarray) -> RerankResult:
    texts = [request.texts[i] for i in indices.tolist()] if request.return_text and request.texts else None
    return RerankResult(request.id, indices=indices, scores=scores, texts=texts)


async def _query(call):
    """Await the query's embed call: an error of its one input is said of the query."""
    try:
        return await call
    except ServiceError as exc:
        if exc.row is None:
            raise
        raise ServiceError(exc.code, exc.text("the query")) from None
