"""Embedding requests over NATS: publish to the tokenizer fleet, gather the workers' result chunks.

One wildcard inbox subscription serves every request of the process; each request's reply subject
is ``<inbox>.<request id>``. A request split into k chunks comes back as several EmbedResult
messages, each naming its rows; the request completes when every row arrived, fails on the first
error, and times out at its deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError

from shared.errors import ErrorCode, ServiceError
from shared.protocol import (
    VECTOR_DTYPES,
    EmbedOptions,
    EmbedRequest,
    EmbedResult,
    ErrorReply,
    ProtocolError,
    RerankRequest,
    RerankResult,
    TokenizeRequest,
    TokenizeResult,
    decode,
    encode,
)
from shared.subjects import Subjects

log = logging.getLogger("embedfleet.client")

_NO_RESPONDERS = "503"


@dataclass(slots=True)
class EmbedOutcome:
    vectors: np.ndarray  # [n, dim], the dtype the request asked for
    tokens: int  # real tokens processed, special tokens included
    timings: dict[str, float]  # seconds per stage (tokenize, queue, inference): the slowest chunk's


class _Pending:
    """Rows gathered so far for one request."""

    def __init__(self, request_id: str, total: int, future: asyncio.Future) -> None:
        self.id = request_id
        self.total = total
        self.future = future
        self.vectors: np.ndarray | None = None
        self.filled = np.zeros(total, dtype=bool)
        self.rows = 0
        self.tokens = 0
        self.timings: dict[str, float] = {}

    def fail(self, error: ServiceError) -> None:
        if not self.future.done():
            self.future.set_exception(error)

    def add(self, result: EmbedResult) -> None:
        if self.future.done():
            return
        rows = result.array()  # [count, dim]
        end = result.start + len(rows)
        if result.total != self.total or end > self.total:
            raise ProtocolError(f"result rows {result.start}..{end} do not fit a request of {self.total}")
        if self.vectors is None:
            self.vectors = np.empty((self.total, result.dim), dtype=VECTOR_DTYPES[result.dtype])
        elif self.vectors.shape[1] != result.dim or self.vectors.dtype != VECTOR_DTYPES[result.dtype]:
            raise ProtocolError("result chunks disagree on dimension or dtype")
        if self.filled[result.start : end].any():
            log.warning("request %s: duplicate rows %d..%d ignored", self.id, result.start, end)
            return
        self.vectors[result.start : end] = rows
        self.filled[result.start : end] = True
        self.rows += len(rows)
        self.tokens += result.tokens
        for stage, seconds in result.timings.items():
            self.timings[stage] = max(self.timings.get(stage, 0.0), seconds)
        if self.rows == self.total:
            self.future.set_result(EmbedOutcome(self.vectors, self.tokens, self.timings))


class EmbedClient:
    """Sends EmbedRequests and gathers their results; shared by the gateway and the scorer."""

    def __init__(self, nc: Client, subjects: Subjects) -> None:
        self._nc = nc
        self._subjects = subjects
        self._inbox = ""
        self._pending: dict[str, _Pending] = {}
        self._sub = None

    async def start(self) -> None:
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_reply)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def embed(
        self,
        model: str,
        texts: list[str],
        options: EmbedOptions,
        timeout: float,
        token_ids: list[np.ndarray] | None = None,
        pairs: list[tuple[str, str]] | None = None,
    ) -> EmbedOutcome:
        """Embed ``texts`` (or inputs given as ``token_ids``, or (query, document) ``pairs`` for a
        cross-encoder, whose "vectors" are its logits) with ``model``.

        Raises ServiceError (timeout, no responders, ...).
        """
        request_id = uuid.uuid4().hex
        request = EmbedRequest(
            id=request_id,
            model=model,
            texts=texts if token_ids is None and pairs is None else [],
            deadline=time.time() + timeout,
            options=options,
            token_ids=token_ids,
            pairs=pairs,
        )
        payload = encode(request)
        if len(payload) > self._nc.max_payload:
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"request is {len(payload)} bytes encoded; the NATS limit is {self._nc.max_payload}: "
                "send fewer or shorter inputs per request",
            )
        pending = _Pending(request_id, request.count, asyncio.get_running_loop().create_future())
        self._pending[request_id] = pending
        try:
            await self._nc.publish(self._subjects.embed(model), payload, reply=f"{self._inbox}.{request_id}")
            return await asyncio.wait_for(pending.future, timeout)
        except asyncio.TimeoutError:
            raise ServiceError(
                ErrorCode.TIMEOUT, f"no complete result within {timeout:g}s ({pending.rows}/{pending.total} rows)"
            ) from None
        finally:
            del self._pending[request_id]

    async def tokenize(
        self, model: str, texts: list[str], add_special_tokens: bool, prompt_name: str | None, timeout: float
    ) -> TokenizeResult:
        """Ask a tokenizer how ``texts`` tokenize."""
        request = TokenizeRequest(uuid.uuid4().hex, model, texts, add_special_tokens, prompt_name)
        reply = await self._ask(self._subjects.tokenize(model), encode(request), "tokenizer", timeout)
        if not isinstance(reply, TokenizeResult) or len(reply.tokens) != len(texts):
            raise ServiceError(ErrorCode.INTERNAL, "a tokenizer sent an unexpected reply")
        return reply

    async def rerank(self, request: RerankRequest, timeout: float) -> RerankResult:
        """Ask a scorer to rank ``request``'s candidates (one deadline for the whole rerank)."""
        reply = await self._ask(self._subjects.rerank(request.model), encode(request), "scorer", timeout)
        if not isinstance(reply, RerankResult) or len(reply.indices) > request.count or (
            len(reply.indices) and (reply.indices.min() < 0 or reply.indices.max() >= request.count)
        ):
            raise ServiceError(ErrorCode.INTERNAL, "a scorer sent an unexpected reply")
        return reply

    async def _ask(self, subject: str, payload: bytes, who: str, timeout: float):
        """One request-reply to a ``who`` service: its reply decoded, or its error raised."""
        try:
            msg = await self._nc.request(subject, payload, timeout=timeout)
        except NoRespondersError:
            raise ServiceError(ErrorCode.NO_RESPONDERS, f"no {who} is serving this model right now") from None
        except asyncio.TimeoutError:
            raise ServiceError(ErrorCode.TIMEOUT, f"no answer from a {who} within {timeout:g}s") from None
        try:
            reply = decode(msg.data)
        except ProtocolError:
            raise ServiceError(ErrorCode.INTERNAL, f"a {who} sent a malformed reply") from None
        if isinstance(reply, ErrorReply):
            raise ServiceError(reply.code, reply.message)
        return reply

    async def _on_reply(self, msg: Msg) -> None:
        pending = self._pending.get(msg.subject.rsplit(".", 1)[-1])
        if pending is None:
            return  # late reply for a request that already finished or timed out
        if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
            pending.fail(ServiceError(ErrorCode.NO_RESPONDERS, "no tokenizer or worker is serving this model right now"))
            return
        try:
            reply = decode(msg.data)
            if isinstance(reply, ErrorReply):
                pending.fail(ServiceError(reply.code, reply.message))
            elif isinstance(reply, EmbedResult):
                pending.add(reply)
            else:
                raise ProtocolError(f"unexpected {type(reply).__name__} on a reply subject")
        except ProtocolError as exc:
            log.error("request %s: bad reply: %s", pending.id, exc)
            pending.fail(ServiceError(ErrorCode.INTERNAL, "a worker sent a malformed reply"))
