"""Tokenizer service: EmbedRequest in (queue group), TokenChunk chunks out to the workers."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg

from shared.errors import ErrorCode, ServiceError
from shared.lifecycle import register
from shared.metrics_server import serve_metrics
from shared.protocol import (
    DecodeRequest,
    DecodeResult,
    EmbedOptions,
    EmbedRequest,
    ErrorReply,
    LoadReport,
    ProtocolError,
    TokenChunk,
    TokenizeRequest,
    TokenizeResult,
    decode_as,
    encode,
)
from shared.subjects import TOKENIZER_QUEUE, model_token
from shared.tracing import Span, Tracer, bind, current, from_headers, headers_for
from services.tokenizer.config import TokenizerConfig
from services.tokenizer.encoder import TextEncoder, pack_chunks
from services.tokenizer.bulk import BulkTokenizer
from services.tokenizer.delivery import DeliveryCheck, Sent
from services.tokenizer.metrics import TokenizerMetrics
from services.tokenizer.routing import Router

log = logging.getLogger("embedfleet.tokenizer")


# requests up to this many characters are tokenized on the event loop (tens of microseconds): handing
# them to a thread costs more than the work, in wake-ups and GIL hand-offs
_INLINE_CHARS = 2048
# subjects tried for a request's batches that reached no worker, before the requester is told none took them
_MAX_TRIES = 3


async def _off_loop(size: int, encode: Callable[..., Any], *args: Any) -> Any:
    """``encode(*args)``: on a thread when the input is large (the loop keeps serving), else here."""
    if size <= _INLINE_CHARS:
        return encode(*args)
    return await asyncio.to_thread(encode, *args)


class TokenizerService:
    def __init__(self, nc: Client, cfg: TokenizerConfig) -> None:
        self._nc = nc
        self._cfg = cfg
        self._encoder = TextEncoder(cfg.model, cfg.prompts)
        self._subjects = cfg.nats.subjects
        self._sub = None
        self._tokenize_sub = None
        self._decode_sub = None
        self._load_sub = None
        self._router = Router()
        self._delivery = DeliveryCheck(nc, self._missed)
        self._bulk: BulkTokenizer | None = None
        self._micro = None
        self.metrics = TokenizerMetrics(cfg.model.id)
        self._exporter = None
        self._tracer = Tracer("tokenizer", cfg.tracing)

    async def start(self) -> None:
        self._exporter = serve_metrics(self.metrics.registry, self._cfg.metrics)
        model = self._cfg.model
        await self._delivery.start()
        self._sub = await self._nc.subscribe(
            self._subjects.embed(model.id), queue=TOKENIZER_QUEUE, cb=self._on_request
        )
        self._tokenize_sub = await self._nc.subscribe(
            self._subjects.tokenize(model.id), queue=TOKENIZER_QUEUE, cb=self._on_tokenize
        )
        self._decode_sub = await self._nc.subscribe(
            self._subjects.decode(model.id), queue=TOKENIZER_QUEUE, cb=self._on_decode
        )
        if self._cfg.routing == "load":
            self._load_sub = await self._nc.subscribe(self._subjects.load(model.id), cb=self._on_load)
        try:
            bulk = BulkTokenizer(self._nc, self._cfg, self.metrics.bulk_view(self._encoder), self._tracer)
            await bulk.start()
            self._bulk = bulk
        except Exception as exc:  # a NATS server without JetStream still serves online requests
            log.warning("bulk jobs disabled: JetStream is not available (%s)", exc)
        self._micro = await register(
            self._nc,
            self._subjects,
            "tokenizer",
            "text -> token IDs",
            {
                "model": model.id,
                "max_seq_length": str(model.max_seq_length),
                "dim": str(model.dim),
                "vocab_size": str(model.vocab_size),
                "pooling": model.pooling,
                "prompts": ",".join(sorted(self._encoder.prompts)),
            },
        )
        log.info("serving %s on %s (limit %d tokens)", model.id, self._subjects.embed(model.id), model.max_seq_length)

    async def stop(self) -> None:
        if self._bulk is not None:
            await self._bulk.stop()
            self._bulk = None
        for sub in (self._sub, self._tokenize_sub, self._decode_sub, self._load_sub):
            if sub is not None:
                await sub.drain()  # finishes messages already received
        self._sub = self._tokenize_sub = self._decode_sub = self._load_sub = None
        await self._delivery.stop()
        if self._micro is not None:
            await self._micro.stop()
            self._micro = None
        if self._exporter is not None:
            self._exporter.close()
        self._tracer.shutdown()

    async def _on_request(self, msg: Msg) -> None:
        await self._answering(msg, EmbedRequest, self._handle)

    async def _on_tokenize(self, msg: Msg) -> None:
        await self._answering(msg, TokenizeRequest, self._tokenize)

    async def _on_decode(self, msg: Msg) -> None:
        await self._answering(msg, DecodeRequest, self._decode)

    async def _answering(self, msg: Msg, kind: type, handle: Callable[[Any, str | None], Awaitable[None]]) -> None:
        """Decode a request of ``kind`` and handle it; every failure is answered as an error reply."""
        request_id = ""
        self.metrics.request(kind.TYPE)
        span = self._tracer.start(f"tokenizer {kind.TYPE}", from_headers(msg.headers), "consumer")
        bind(span.context, "")  # the subscription's task runs every message: each binds its own
        try:
            request = decode_as(msg.data, kind)
            request_id = request.id
            bind(span.context, request_id)
            span.set(request_id=request_id, model=request.model)
            await handle(request, msg.reply)
        except ProtocolError as exc:
            await self._reply_error(msg.reply, request_id, ServiceError(ErrorCode.INVALID_REQUEST, str(exc)), span)
        except ServiceError as exc:
            await self._reply_error(msg.reply, request_id, exc, span)
        except Exception:
            log.exception("%s %s failed", kind.TYPE, request_id)
            await self._reply_error(msg.reply, request_id, ServiceError(ErrorCode.INTERNAL, "tokenizer error"), span)
        finally:
            span.end()

    async def _handle(self, request: EmbedRequest, reply: str | None) -> None:
        if not reply:
            raise ProtocolError("embed request without a reply subject")
        self._check_model(request.model)
        if request.count == 0:
            raise ServiceError(ErrorCode.INVALID_REQUEST, "no inputs to embed")
        if time.time() > request.deadline:
            raise ServiceError(ErrorCode.TIMEOUT, "deadline passed before tokenization")
        t0 = time.perf_counter()
        opts = request.options
        types, prompt_tokens = None, 0
        if request.token_ids is not None:
            ids = self._encoder.check_ids(request.token_ids, opts.truncate, opts.truncation_direction)
        elif request.pairs is not None:
            size = sum(len(q) + len(d) for q, d in request.pairs)
            ids, types = await _off_loop(size, self._encoder.encode_pairs, request.pairs, opts.truncate,
                                         opts.truncation_direction)
        else:
            texts = self._encoder.with_prompt(request.texts, opts)
            prompt_tokens = self._encoder.prompt_tokens(opts)
            ids = await _off_loop(sum(map(len, texts)), self._encoder.encode, texts, opts.truncate,
                                  opts.truncation_direction)
        timings = {"tokenize": time.perf_counter() - t0}
        headers = headers_for(current())  # the workers' spans are this one's children
        by_subject = self._route(request, ids, types, timings, prompt_tokens)
        for subject, (payloads, tokens) in by_subject.items():
            await self._delivery.publish(Sent(subject, tuple(payloads), tokens, reply, headers, request.id, request.model))
        chunks = sum(len(payloads) for payloads, _ in by_subject.values())
        self.metrics.embedded(ids, timings["tokenize"], chunks)
        log.debug(
            "request %s: %d inputs -> %d chunks in %.1f ms",
            request.id, request.count, chunks, (time.perf_counter() - t0) * 1e3,
        )

    def _route(self, request: EmbedRequest, ids: list, types: list | None, timings: dict[str, float],
               prompt_tokens: int) -> dict[str, tuple[list[bytes], int]]:
        """``request``'s token IDs packed into batches, each for the worker the router picks (the shared
        subject when it knows none): subject -> (encoded batches, their tokens)."""
        shared_subject = self._subjects.tokens(request.model)
        by_subject: dict[str, tuple[list[bytes], int]] = {}
        for chunk in pack_chunks(ids, self._cfg.chunk_tokens, self._cfg.chunk_seqs, types):
            batch = TokenChunk(
                id=request.id,
                model=request.model,
                start=chunk.start,
                total=request.count,
                input_ids=chunk.input_ids,
                cu_seqlens=chunk.cu_seqlens,
                deadline=request.deadline,
                options=request.options,
                timings=timings,
                token_types=chunk.token_types,
                prompt_tokens=prompt_tokens,
                held=request.held,  # the requester asked to learn which worker holds which rows
            )
            subject = self._router.pick(len(chunk.input_ids), time.monotonic()) or shared_subject
            payloads, tokens = by_subject.get(subject, ([], 0))
            by_subject[subject] = ([*payloads, encode(batch)], tokens + len(chunk.input_ids))
        return by_subject

    async def _missed(self, sent: Sent) -> None:
        """Batches that reached no worker: the worker picked is gone (forgotten now): to the next the
        router picks; none left (the shared subject found nobody too): the requester is told no worker
        took them, and sends them again once one serves the model."""
        shared = self._subjects.tokens(sent.model)
        if sent.subject != shared:
            self._router.forget(sent.subject)
            if sent.tries < _MAX_TRIES:
                subject = self._router.pick(sent.tokens, time.monotonic()) or shared
                log.info("request %s: worker on %s is gone; its %d batches go to %s", sent.request_id, sent.subject,
                         len(sent.payloads), subject)
                await self._delivery.publish(replace(sent, subject=subject, tries=sent.tries + 1))
                return
        log.info("request %s: no worker serves %s; the requester sends the rows again", sent.request_id, sent.model)
        error = ErrorReply(sent.request_id, ErrorCode.NO_RESPONDERS, f"no worker is serving {sent.model} right now")
        await self._nc.publish(sent.reply, encode(error))

    def _check_model(self, model: str) -> None:
        """Only this model's tokenizer may answer: another's would use the wrong vocabulary."""
        if model_token(model) != model_token(self._cfg.model.id):
            raise ServiceError(ErrorCode.MODEL_NOT_FOUND,
                               f"this subject serves {self._cfg.model.id}, not {model[:200]!r}")

    async def _on_load(self, msg: Msg) -> None:
        try:
            report = decode_as(msg.data, LoadReport)
        except ProtocolError as exc:
            log.debug("bad load report: %s", exc)
            return
        # a worker announces only its own direct subject: anything else would route token batches astray
        if report.model == self._cfg.model.id and report.subject == self._subjects.worker(report.model, report.id):
            self._router.update(report, time.monotonic())
        else:
            log.debug("load report for another model or subject ignored: %s", report.subject[:200])

    async def _tokenize(self, request: TokenizeRequest, reply: str | None) -> None:
        self._check_model(request.model)
        texts = self._encoder.with_prompt(request.texts, EmbedOptions(prompt_name=request.prompt_name))
        tokens = await asyncio.to_thread(self._encoder.tokenize, texts, request.add_special_tokens)
        await self._answer(reply, encode(TokenizeResult(request.id, tokens)), "the tokens", "fewer or shorter texts")

    async def _decode(self, request: DecodeRequest, reply: str | None) -> None:
        self._check_model(request.model)
        size = sum(len(seq) for seq in request.ids)
        texts = await _off_loop(size, self._encoder.decode, request.ids, request.skip_special_tokens)
        await self._answer(reply, encode(DecodeResult(request.id, texts)), "the texts", "fewer token IDs")

    async def _answer(self, reply: str | None, payload: bytes, what: str, fewer: str) -> None:
        """Publish an answer that fits one NATS message; one that does not is the request's error."""
        if len(payload) > self._nc.max_payload:
            raise ServiceError(ErrorCode.INVALID_REQUEST, f"{what} take {len(payload)} bytes; the NATS limit is "
                               f"{self._nc.max_payload}: send {fewer} per request")
        if reply:
            await self._nc.publish(reply, payload)

    async def _reply_error(self, reply: str | None, request_id: str, error: ServiceError, span: Span) -> None:
        log.info("request %s: %s: %s", request_id or "?", error.code.value, error.text())
        span.error(error.code.value, error.text())
        self.metrics.error(error.code.value)
        if reply:
            await self._nc.publish(reply, encode(ErrorReply(request_id, error.code, error.message, error.row)))
