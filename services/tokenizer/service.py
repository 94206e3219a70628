"""Tokenizer service: EmbedRequest in (queue group), TokenChunk chunks out to the workers; and the
gateway's questions answered: how texts tokenize, what token IDs read as, where long texts are cut."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.micro.service import Service

from embedfleet.services.tokenizer.bulk import BulkTokenizer
from embedfleet.services.tokenizer.coalesce import Coalescer
from embedfleet.services.tokenizer.config import TokenizerConfig
from embedfleet.services.tokenizer.delivery import DeliveryCheck, Sent
from embedfleet.services.tokenizer.encoder import TextEncoder, pack_chunks
from embedfleet.services.tokenizer.fast_check import choose
from embedfleet.services.tokenizer.images import ImagePreparer
from embedfleet.services.tokenizer.layout import Layouts
from embedfleet.services.tokenizer.metrics import TokenizerMetrics
from embedfleet.services.tokenizer.pages import Page, PagePreparer, pack_pages
from embedfleet.services.tokenizer.routing import Router
from embedfleet.services.tokenizer.span_rows import place_spans
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.images.decode import ImageLimits
from embedfleet.shared.nats.bundles import Entry, answer, carrier_of, is_bundle, unbundle
from embedfleet.shared.nats.cancel_keys import CancelKeys
from embedfleet.shared.nats.lifecycle import register, start_jetstream_part
from embedfleet.shared.nats.subjects import TOKENIZER_QUEUE, model_token
from embedfleet.shared.observability.metrics_server import MetricsServer, serve_metrics
from embedfleet.shared.observability.tracing import Span, Tracer, bind, from_headers, headers_for
from embedfleet.shared.protocol import (
    ChunkRequest,
    DecodeRequest,
    DecodeResult,
    EmbedOptions,
    EmbedRequest,
    ErrorReply,
    LoadReport,
    ProtocolError,
    Spans,
    TokenChunk,
    TokenizeRequest,
    TokenizeResult,
    decode_as,
    encode,
)

log = logging.getLogger("embedfleet.tokenizer")


# the requests answered one by one (each with its own handler)
_Request = TypeVar("_Request", TokenizeRequest, DecodeRequest, ChunkRequest)
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


@dataclass(slots=True)
class _Pending:
    """An embed request on its way through a group: what it has come to so far."""

    request: EmbedRequest | None  # None: the message was no valid request
    reply: str
    span: Span
    error: ServiceError | None = None  # what it is answered instead, once set
    texts: list[str] | None = None  # with the prompt
    prompt_tokens: int = 0
    ids: list | None = None
    types: list | None = None
    frame: tuple[int, int] = (
        0,
        0,
    )  # output "spans": tokens before and after each text's content (TextEncoder.frame_sizes)
    spans: Spans | None = None  # output "spans": placed in the rows' sequences, once tokenized
    pixels: np.ndarray | None = None  # its images, prepared: [N, C, H, W] uint8
    pages: list[Page] | None = None  # a page model's images, prepared (each its row's ids and patch rows)
    sent: list[Sent] = field(default_factory=list)  # its batches, by subject
    carrier: str = ""  # the reply subject of the message that brought it (another: it came in a Requests)
    dropped: bool = False  # its requester cancelled it: nothing of it is sent, nothing answered

    @property
    def request_id(self) -> str:
        return self.request.id if self.request is not None else ""

    @property
    def admitted(self) -> EmbedRequest:
        """``request``, of one past ``_admit`` without an error (only those are tokenized and routed)."""
        assert self.request is not None
        return self.request

    @property
    def token_ids(self) -> list:
        """``ids``, of one tokenized without an error."""
        assert self.ids is not None
        return self.ids


def _by_tokenization(group: list[_Pending]) -> dict[tuple[str, bool, str], list[_Pending]]:
    """Requests keyed by how they are tokenized: (texts | pairs | ids, truncate, direction)."""
    out: dict[tuple[str, bool, str], list[_Pending]] = {}
    for p in group:
        opts = p.admitted.options
        what = (
            "texts"
            if p.texts is not None
            else "pairs"
            if p.admitted.pairs is not None
            else "images"
            if p.admitted.images is not None
            else "ids"
        )
        out.setdefault((what, opts.truncate, opts.truncation_direction), []).append(p)
    return out


class TokenizerService:
    def __init__(self, nc: Client, cfg: TokenizerConfig) -> None:
        self._nc = nc
        self._cfg = cfg
        self._encoder = TextEncoder(cfg.model, cfg.prompts)
        self.tokenizer_path = choose(self._encoder, cfg.model.path, cfg.fast_tokenizer)  # kitoken or tokenizers
        self._subjects = cfg.nats.subjects
        self._sub: Subscription | None = None
        self._tokenize_sub: Subscription | None = None
        self._decode_sub: Subscription | None = None
        self._chunk_sub: Subscription | None = None
        self._load_sub: Subscription | None = None
        self._cancel_sub: Subscription | None = None
        self._cancels = CancelKeys()  # requests given up by their requesters (shared/protocol's Cancel)
        self._layouts = Layouts(self._encoder, cfg.max_chunks, cfg.max_document_chars)
        # None: the model embeds texts only
        limits = ImageLimits(cfg.max_image_bytes, cfg.max_image_pixels)
        self._images = ImagePreparer.for_model(cfg.model, limits)
        self._pages = PagePreparer.for_model(cfg.model, self._encoder, limits)  # None: not a page model
        self._router = Router()
        self._delivery = DeliveryCheck(nc, self._missed)
        self._embeds = Coalescer(self._embed_group)
        self._bulk: BulkTokenizer | None = None
        self._micro: Service | None = None
        self.metrics = TokenizerMetrics(cfg.model.id)
        self._exporter: MetricsServer | None = None
        self._tracer = Tracer("tokenizer", cfg.tracing)

    async def start(self) -> None:
        self._exporter = serve_metrics(self.metrics.registry, self._cfg.metrics)
        model = self._cfg.model
        await self._delivery.start()
        self._embeds.start()
        self._sub = await self._nc.subscribe(self._subjects.embed(model.id), queue=TOKENIZER_QUEUE, cb=self._on_request)
        self._tokenize_sub = await self._nc.subscribe(
            self._subjects.tokenize(model.id), queue=TOKENIZER_QUEUE, cb=self._on_tokenize
        )
        self._decode_sub = await self._nc.subscribe(
            self._subjects.decode(model.id), queue=TOKENIZER_QUEUE, cb=self._on_decode
        )
        self._chunk_sub = await self._nc.subscribe(
            self._subjects.chunk(model.id), queue=TOKENIZER_QUEUE, cb=self._on_chunk
        )
        # every tokenizer of the model hears each Cancel: the request may be queued on any of them
        self._cancel_sub = await self._nc.subscribe(self._subjects.cancel(model.id), cb=self._on_cancel)
        if self._cfg.routing == "load":
            self._load_sub = await self._nc.subscribe(self._subjects.load(model.id), cb=self._on_load)
        try:
            bulk = BulkTokenizer(
                self._nc, self._cfg, self.metrics.bulk_view(self._encoder), self._tracer, self._images, self._pages
            )
            await start_jetstream_part(bulk.start)  # a cluster just started may still elect its leader
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
                "tasks": ",".join(self._encoder.adapters),
                "tokenizer": self.tokenizer_path,
                "max_chunks": str(self._cfg.max_chunks),  # a chunked job's batches are fitted to it (job_fit.py)
            },
        )
        log.info("serving %s on %s (limit %d tokens)", model.id, self._subjects.embed(model.id), model.max_seq_length)

    async def stop(self) -> None:
        if self._bulk is not None:
            await self._bulk.stop()
            self._bulk = None
        subs = (self._sub, self._tokenize_sub, self._decode_sub, self._chunk_sub, self._load_sub, self._cancel_sub)
        for sub in subs:
            if sub is not None:
                await sub.drain()  # finishes messages already received
        self._sub = self._tokenize_sub = self._decode_sub = self._chunk_sub = self._load_sub = self._cancel_sub = None
        await self._embeds.stop()  # the embed requests received: handled before the connection goes
        await self._delivery.stop()
        if self._micro is not None:
            await self._micro.stop()
            self._micro = None
        if self._exporter is not None:
            self._exporter.close()
        self._tracer.shutdown()

    async def _on_request(self, msg: Msg) -> None:
        # handled with whatever else is queued by the time its turn comes; a Requests message's entries
        # each as if it had come alone
        if not is_bundle(msg.data):
            await self._embeds.put(msg)
            return
        try:
            entries = unbundle(msg)
        except ProtocolError as exc:
            span = self._tracer.start(f"tokenizer {EmbedRequest.TYPE}", None, "consumer")
            await self._reply_error(msg.reply, "", ServiceError(ErrorCode.INVALID_REQUEST, str(exc)), span)
            span.end()
            return
        self.metrics.bundled(len(entries))
        for entry in entries:
            await self._embeds.put(entry)

    async def _on_tokenize(self, msg: Msg) -> None:
        await self._answering(msg, TokenizeRequest, self._tokenize)

    async def _on_decode(self, msg: Msg) -> None:
        await self._answering(msg, DecodeRequest, self._decode)

    async def _on_chunk(self, msg: Msg) -> None:
        await self._answering(msg, ChunkRequest, self._chunk)

    async def _answering(
        self, msg: Msg, kind: type[_Request], handle: Callable[[_Request, str | None], Awaitable[None]]
    ) -> None:
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

    async def _embed_group(self, msgs: list[Msg | Entry]) -> None:
        """Embed requests queued together: each decoded and checked alone, those that tokenize alike
        tokenized in one call, then all routed and published in one pass (one socket write)."""
        self.metrics.request(EmbedRequest.TYPE, len(msgs))
        admitted = [self._admit(msg) for msg in msgs]
        for p in admitted:
            if p.error is not None:
                await self._refuse(p)
        tokenized = [p for p in admitted if p.error is None and not self._abandoned(p, "queued")]
        sents: list[Sent] = []
        for kind, group in _by_tokenization(tokenized).items():
            seconds = await self._tokenize_group(kind, group)
            for p in group:  # a Cancel may have come while they were tokenized
                if p.error is None and self._abandoned(p, "tokenized"):
                    continue
                if p.error is None and p.admitted.spans is not None:
                    self._place(p)
                if p.error is None:
                    p.sent = self._routed(p, seconds)
            done = [p for p in group if p.error is None and not p.dropped]
            for p in group:
                if p.error is not None:
                    await self._refuse(p)
            if done:
                chunks = sum(len(sent.payloads) for p in done for sent in p.sent)
                self.metrics.embedded([seq for p in done for seq in p.token_ids], seconds, chunks, len(done))
                sents += [sent for p in done for sent in p.sent]
        await self._delivery.publish(sents)
        for p in admitted:
            p.span.end()
        log.debug("%d requests: %d token batches", len(msgs), sum(len(s.payloads) for s in sents))

    async def _on_cancel(self, msg: Msg) -> None:
        self._cancels.take(msg.data, time.time())  # the requests it names are dropped where they are met

    def _abandoned(self, p: _Pending, stage: str) -> bool:
        """Whether ``p``'s requester cancelled it (a Cancel with its request's key came): then it is dropped."""
        if p.request is None or not self._cancels.holds(p.request.cancel_key, time.time()):
            return False
        p.dropped = True
        log.info("request %s: cancelled by its requester: %d inputs dropped %s", p.request.id, p.request.count, stage)
        return True

    async def _refuse(self, p: _Pending) -> None:
        bind(p.span.context, p.request_id)  # its log lines name it and its trace
        assert p.error is not None  # refused for it
        await self._reply_error(p.reply, p.request_id, p.error, p.span, p.carrier)

    def _admit(self, msg: Msg | Entry) -> _Pending:
        """``msg`` decoded and checked, its prompt applied; what is wrong with it kept as its error."""
        span = self._tracer.start(f"tokenizer {EmbedRequest.TYPE}", from_headers(msg.headers), "consumer")
        try:
            request = decode_as(msg.data, EmbedRequest)
        except ProtocolError as exc:
            return _Pending(
                None,
                msg.reply or "",
                span,
                error=ServiceError(ErrorCode.INVALID_REQUEST, str(exc)),
                carrier=carrier_of(msg),
            )
        span.set(request_id=request.id, model=request.model)
        pending = _Pending(request, msg.reply or "", span, carrier=carrier_of(msg))
        try:
            self._check_embed(request, msg.reply)
            if request.images is not None:
                self._check_images(request)
            elif request.texts or request.token_ids is not None:
                # the task adapter its rows run with, and its prompt: the worker reads the task from the batches
                request = pending.request = replace(request, options=self._encoder.resolve(request.options))
            if request.texts:
                pending.texts = self._encoder.with_prompt(request.texts, request.options)
                pending.prompt_tokens = self._encoder.prompt_tokens(request.options)
                if request.spans is not None:
                    pending.frame = self._encoder.frame_sizes(request.options)
            elif request.token_ids is not None:
                opts = request.options
                pending.ids = self._encoder.check_ids(request.token_ids, opts.truncate, opts.truncation_direction)
        except ProtocolError as exc:
            pending.error = ServiceError(ErrorCode.INVALID_REQUEST, str(exc))
        except ServiceError as exc:
            pending.error = exc
        return pending

    def _check_embed(self, request: EmbedRequest, reply: str | None) -> None:
        if not reply:
            raise ProtocolError("embed request without a reply subject")
        self._check_model(request.model)
        if request.count == 0:
            raise ServiceError(ErrorCode.INVALID_REQUEST, "no inputs to embed")
        if time.time() > request.deadline:
            raise ServiceError(ErrorCode.TIMEOUT, "deadline passed before tokenization")

    def _check_images(self, request: EmbedRequest) -> None:
        if self._cfg.model.pages:
            if not self._cfg.model.serves(request.options.output):
                raise ServiceError(
                    ErrorCode.INVALID_REQUEST,
                    f"model {self._cfg.model.id} makes {', '.join(self._cfg.model.outputs)} vectors of images, "
                    f"not {request.options.output}",
                )
            return
        if self._images is None and self._pages is None:
            raise ServiceError(ErrorCode.INVALID_REQUEST, f"model {self._cfg.model.id} embeds texts only, not images")
        if request.options.output != "dense":
            raise ServiceError(
                ErrorCode.INVALID_REQUEST, f"images make dense vectors only, not {request.options.output}"
            )

    async def _tokenize_group(self, kind: tuple[str, bool, str], group: list[_Pending]) -> float:
        """Token IDs of every request of ``group`` (all of one ``kind``), in one call into the tokenizer;
        returns the seconds it took. A request's own error (a row too long) is kept on it."""
        what, truncate, direction = kind
        t0 = time.perf_counter()
        try:
            if what == "texts":
                texts = [p.texts for p in group if p.texts is not None]  # all of them: a group of texts
                each = await _off_loop(
                    sum(len(t) for ts in texts for t in ts), self._encoder.encode_each, texts, truncate, direction
                )
                for p, ids in zip(group, each):
                    p.error, p.ids = (ids, None) if isinstance(ids, ServiceError) else (None, ids)
            elif what == "images" and self._pages is not None:
                files = [p.admitted.images or [] for p in group]
                pages = await asyncio.to_thread(self._pages.prepare_each, files)
                for p, made in zip(group, pages):
                    if isinstance(made, ServiceError):
                        p.error = made
                    else:
                        p.pages, p.ids = made, [page.counted for page in made]
            elif what == "images":
                assert self._images is not None  # _admit refused images for a model without an image tower
                files = [p.admitted.images or [] for p in group]
                prepared = await asyncio.to_thread(self._images.prepare_each, files)
                row = np.zeros(self._images.tokens, np.int32)  # what each image counts as (metrics, routing)
                for p, out in zip(group, prepared):
                    if isinstance(out, ServiceError):
                        p.error = out
                    else:
                        p.pixels, p.ids = out, [row] * len(out)
            elif what == "pairs":
                pairs = [ps for p in group if (ps := p.admitted.pairs) is not None]  # all of them: a group of pairs
                size = sum(len(q) + len(d) for ps in pairs for q, d in ps)
                each = await _off_loop(size, self._encoder.encode_pairs_each, pairs, truncate, direction)
                for p, out in zip(group, each):
                    if isinstance(out, ServiceError):
                        p.error = out
                    else:
                        p.ids, p.types = out
        except Exception:
            log.exception("tokenizing %d requests failed", len(group))
            for p in group:
                p.error = ServiceError(ErrorCode.INTERNAL, "tokenizer error")
        return time.perf_counter() - t0

    @staticmethod
    def _place(p: _Pending) -> None:
        """A spans request's spans placed in its rows' sequences; a text that tokenized otherwise is its error."""
        try:
            spans = p.admitted.spans
            assert spans is not None  # placed for a spans request alone
            p.spans = place_spans(spans, p.token_ids, *p.frame)
        except ServiceError as exc:
            p.error = exc

    def _routed(self, p: _Pending, seconds: float) -> list[Sent]:
        """``p``'s batches, each for the worker the router picks; an unexpected failure is kept as its error."""
        request = p.admitted
        try:
            bind(p.span.context, request.id)
            timings = {"tokenize": seconds}
            if p.pixels is not None:
                by_subject = self._route_images(request, p.pixels, timings)
            elif p.pages is not None:
                by_subject = self._route_pages(request, p.pages, timings)
            else:
                by_subject = self._route(request, p.token_ids, p.types, timings, p.prompt_tokens, p.spans)
        except Exception:
            log.exception("%s %s failed", request.TYPE, request.id)
            p.error = ServiceError(ErrorCode.INTERNAL, "tokenizer error")
            return []
        headers = headers_for(p.span.context)  # the workers' spans are this one's children
        return [
            Sent(
                subject,
                tuple(payloads),
                tokens,
                p.reply,
                headers,
                request.id,
                request.model,
                request.replies,
                p.carrier,
                avoid=request.avoid,
            )
            for subject, (payloads, tokens) in by_subject.items()
        ]

    def _route(
        self,
        request: EmbedRequest,
        ids: list,
        types: list | None,
        timings: dict[str, float],
        prompt_tokens: int,
        spans: Spans | None = None,
    ) -> dict[str, tuple[list[bytes], int]]:
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
                replies=request.replies,  # the worker may answer several of the requester's requests at once
                cancel_key=request.cancel_key,  # a Cancel of the requester drops the rows the worker has not run
                spans=None if spans is None else spans.between(chunk.start, chunk.start + len(chunk.cu_seqlens) - 1),
            )
            subject = self._router.pick(len(chunk.input_ids), time.monotonic(), request.avoid) or shared_subject
            payloads, tokens = by_subject.get(subject, ([], 0))
            by_subject[subject] = ([*payloads, encode(batch)], tokens + len(chunk.input_ids))
        return by_subject

    def _route_images(
        self, request: EmbedRequest, pixels: np.ndarray, timings: dict[str, float]
    ) -> dict[str, tuple[list[bytes], int]]:
        """``request``'s prepared images in chunks that each fit a message, routed as ``_route`` routes tokens."""
        images = self._images
        assert images is not None  # images are prepared only for a model with an image tower
        return self._route_chunks(
            request,
            timings,
            (
                (
                    start,
                    {"input_ids": np.zeros(0, np.int32), "cu_seqlens": images.cu_seqlens(len(part)), "pixels": part},
                )
                for start, part in images.chunks(pixels, self._nc.max_payload, self._cfg.chunk_seqs)
            ),
        )

    def _route_pages(
        self, request: EmbedRequest, pages: list[Page], timings: dict[str, float]
    ) -> dict[str, tuple[list[bytes], int]]:
        """A page model's prepared images in chunks that each fit a message (ids and patch rows), routed as
        ``_route`` routes tokens."""

        def rows(lo: int, hi: int) -> dict:
            ids, cu, patches, grids = pack_pages(pages[lo:hi])
            return {"input_ids": ids, "cu_seqlens": cu, "pages": patches, "page_grids": grids}

        chunks = PagePreparer.chunks(pages, self._nc.max_payload, self._cfg.chunk_seqs)
        return self._route_chunks(request, timings, ((lo, rows(lo, hi)) for lo, hi in chunks))

    def _route_chunks(
        self, request: EmbedRequest, timings: dict[str, float], chunks: Iterable[tuple[int, dict]]
    ) -> dict[str, tuple[list[bytes], int]]:
        """Image or page chunks ((first row, their rows' fields) each) as TokenChunks of ``request``, each for the
        worker the router picks by the tokens it runs: subject -> (encoded batches, their tokens)."""
        shared_subject = self._subjects.tokens(request.model)
        by_subject: dict[str, tuple[list[bytes], int]] = {}
        for start, rows in chunks:
            batch = TokenChunk(
                id=request.id,
                model=request.model,
                start=start,
                total=request.count,
                deadline=request.deadline,
                options=request.options,
                timings=timings,
                held=request.held,
                replies=request.replies,
                cancel_key=request.cancel_key,
                **rows,
            )
            tokens = batch.num_tokens
            subject = self._router.pick(tokens, time.monotonic(), request.avoid) or shared_subject
            payloads, sent = by_subject.get(subject, ([], 0))
            by_subject[subject] = ([*payloads, encode(batch)], sent + tokens)
        return by_subject

    async def _missed(self, sent: Sent) -> None:
        """Batches that reached no worker: the worker picked is gone (forgotten now): to the next the
        router picks; none left (the shared subject found nobody too): the requester is told no worker
        took them, and sends them again once one serves the model."""
        shared = self._subjects.tokens(sent.model)
        if sent.subject != shared:
            self._router.forget(sent.subject)
            if sent.tries < _MAX_TRIES:
                subject = self._router.pick(sent.tokens, time.monotonic(), sent.avoid) or shared
                log.info(
                    "request %s: worker on %s is gone; its %d batches go to %s",
                    sent.request_id,
                    sent.subject,
                    len(sent.payloads),
                    subject,
                )
                await self._delivery.publish([replace(sent, subject=subject, tries=sent.tries + 1)])
                return
        log.info("request %s: no worker serves %s; the requester sends the rows again", sent.request_id, sent.model)
        error = ErrorReply(sent.request_id, ErrorCode.NO_RESPONDERS, f"no worker is serving {sent.model} right now")
        await self._nc.publish(*answer(sent.reply, sent.carrier or sent.reply, encode(error)))

    def _check_model(self, model: str) -> None:
        """Only this model's tokenizer may answer: another's would use the wrong vocabulary."""
        if model_token(model) != model_token(self._cfg.model.id):
            raise ServiceError(
                ErrorCode.MODEL_NOT_FOUND, f"this subject serves {self._cfg.model.id}, not {model[:200]!r}"
            )

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

    async def _chunk(self, request: ChunkRequest, reply: str | None) -> None:
        self._check_model(request.model)
        self._layouts.check(request)
        size = sum(len(t) for t in request.texts)
        layout = await _off_loop(size, self._layouts.layout, request)
        await self._answer(reply, encode(layout), "the chunk layout", "fewer texts")

    async def _answer(self, reply: str | None, payload: bytes, what: str, fewer: str) -> None:
        """Publish an answer that fits one NATS message; one that does not is the request's error."""
        if len(payload) > self._nc.max_payload:
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"{what} take {len(payload)} bytes; the NATS limit is {self._nc.max_payload}: send {fewer} per request",
            )
        if reply:
            await self._nc.publish(reply, payload)

    async def _reply_error(
        self, reply: str | None, request_id: str, error: ServiceError, span: Span, carrier: str | None = None
    ) -> None:
        """``carrier``: the reply subject of the message that brought the request, when it came inside a
        Requests message: the answer goes there, in a Replies (the only subject this may publish to)."""
        log.info("request %s: %s: %s", request_id or "?", error.code.value, error.text())
        span.error(error.code.value, error.text())
        self.metrics.error(error.code.value)
        if reply:
            await self._nc.publish(
                *answer(reply, carrier or reply, encode(ErrorReply(request_id, error.code, error.message, error.row)))
            )
