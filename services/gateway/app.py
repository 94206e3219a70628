"""The gateway's HTTP application: routes, NATS lifecycle, admission, error handling."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator

import numpy as np
from nats.aio.client import Client
from nats.micro.service import Service
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from embedfleet.services.gateway import late_chunking
from embedfleet.services.gateway.auth import ApiKeys
from embedfleet.services.gateway.chunking import Chunking, chunk_texts, mean_of_chunks
from embedfleet.services.gateway.cohere import api as cohere_api
from embedfleet.services.gateway.cohere import serving as cohere_serving
from embedfleet.services.gateway.config import GatewayConfig
from embedfleet.services.gateway.http import health
from embedfleet.services.gateway.http.admission import Admission
from embedfleet.services.gateway.http.browser import BrowserGuard, rules_of
from embedfleet.services.gateway.http.endpoints import Endpoints
from embedfleet.services.gateway.http.errors import ApiError, error_response
from embedfleet.services.gateway.http.formats import json_response, rows_form
from embedfleet.services.gateway.http.limits import KeyLimits, current_key, estimated_tokens
from embedfleet.services.gateway.http.middleware import GatewayMiddleware
from embedfleet.services.gateway.image_fetch import ImageFetcher, ImageHosts
from embedfleet.services.gateway.inputs import Inputs, Limits
from embedfleet.services.gateway.jobs import serving as jobs_serving
from embedfleet.services.gateway.jobs.api import JobsApi
from embedfleet.services.gateway.jobs.listing import parse_listing
from embedfleet.services.gateway.jobs.owners import JobOwners
from embedfleet.services.gateway.jobs.results import JobResultsApi
from embedfleet.services.gateway.jobs.sinks import SinkJobs, SinkTargets
from embedfleet.services.gateway.metrics import Metrics
from embedfleet.services.gateway.openai import api as openai_api
from embedfleet.services.gateway.openai import models as models_api
from embedfleet.services.gateway.openai import serving as openai_serving
from embedfleet.services.gateway.openapi import openapi_spec
from embedfleet.services.gateway.rerank import api as rerank_api
from embedfleet.services.gateway.rerank import late as rerank_late
from embedfleet.services.gateway.rerank import serving as rerank_serving
from embedfleet.services.gateway.routes import PATHS, ROUTES
from embedfleet.services.gateway.search import api as search_api
from embedfleet.services.gateway.search.serving import NOT_SERVED, Search
from embedfleet.services.gateway.search.store import SearchTables
from embedfleet.services.gateway.tei import api as tei_api
from embedfleet.services.gateway.tei import serving as tei_serving
from embedfleet.services.gateway.tei import task_serving as tei_task_serving
from embedfleet.services.gateway.tei import tasks as tei_tasks
from embedfleet.services.gateway.tenants import TableAccess
from embedfleet.shared import __version__
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.images.decode import ImageLimits
from embedfleet.shared.jobs.claims import ClaimedBucket
from embedfleet.shared.jobs.streams import open_streams
from embedfleet.shared.model_dir.info import same_model
from embedfleet.shared.nats.embed_client import EmbedClient, EmbedOutcome, part_of
from embedfleet.shared.nats.fleet import FleetView, FleetWatch
from embedfleet.shared.nats.lifecycle import connect, drain_or_close, mark_ready, register
from embedfleet.shared.observability.metrics_server import serve_metrics
from embedfleet.shared.observability.tracing import Tracer
from embedfleet.shared.protocol import (
    ChunkLayout,
    EmbedOptions,
    ProtocolError,
    RerankRequest,
    RerankResult,
    Spans,
    TokenizeResult,
)
from embedfleet.shared.vectors.forms import FLOAT32
from embedfleet.shared.vectors.quantize import quantize

# seconds the lifespan's shutdown may take before the process exits anyway
_SHUTDOWN_SECONDS = 15
log = logging.getLogger("embedfleet.gateway")

# the statuses starlette's routing raises (unknown path, method not allowed); it raises no others here, and
# another would be answered as a bad request (4xx) or an internal error
_ROUTING = {404: ErrorCode.ROUTE_NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}
# stage -> response header (milliseconds), as text-embeddings-inference names them
TIMING_HEADERS = {"tokenize": "x-tokenization-time", "queue": "x-queue-time", "inference": "x-inference-time"}


class Gateway:
    """State behind the routes: the NATS connection, the embed client, discovery, admission."""

    def __init__(self, cfg: GatewayConfig, metrics: Metrics) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.limits = Limits(
            cfg.max_inputs, cfg.max_input_chars, ImageLimits(cfg.max_image_bytes, cfg.max_image_pixels)
        )
        # image URLs, from --image-hosts only; its HTTP client is opened and closed with the lifespan
        self.image_fetch = ImageFetcher(
            ImageHosts.of(cfg.image_hosts, cfg.image_hosts_private),
            self.limits.images,
            cfg.max_body_bytes,
            cfg.request_timeout,
        )
        # made by the lifespan, before the first request
        self.nc: Client
        self.client: EmbedClient
        self.discovery: FleetWatch
        self._micro: Service
        self.jobs: JobsApi | None = None
        self.sink_jobs: SinkJobs | None = None
        self.job_results: JobResultsApi | None = None
        self.tracer = Tracer("gateway", cfg.tracing)
        self.key_limits = KeyLimits(cfg.key_requests_per_minute, cfg.key_tokens_per_minute)
        # POST /v1/search: the store is attached on the first search (the gateway starts with the store down too)
        # the tables of the stores each API key may write (jobs' "sink") and search (services/gateway/tenants.py)
        self.tables = TableAccess(bool(cfg.api_keys), cfg.operator_keys, dict(cfg.key_tables))
        self.searcher = (
            Search(SearchTables(cfg.search_sink, self.tables), cfg.search_model) if cfg.search_sink else None
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        exporter = serve_metrics(self.metrics.registry, self.cfg.metrics)  # --metrics-port, besides GET /metrics
        self.nc = await connect(self.cfg.nats, "embedfleet-gateway")
        # liveness checks while requests are in flight: the rows a killed process held go out again at once
        self.discovery = FleetWatch(
            self.nc,
            self.cfg.nats.subjects.prefix,
            self.cfg.discovery_wait,
            self.cfg.discovery_interval,
            busy=lambda: self.client.in_flight > 0,
        )  # asked once started, below
        self.client = EmbedClient(self.nc, self.cfg.nats.subjects, self.cfg.retries, self.discovery)
        self.discovery.on_lost(self.client.resend_missing)
        await self.client.start()
        self.image_fetch.open()
        await self.discovery.start()
        self._micro = await register(
            self.nc, self.cfg.nats.subjects, "gateway", "HTTP gateway", {"port": str(self.cfg.port)}
        )
        try:
            js = self.nc.jetstream()
            # made by `embedfleet init`; read by key through the jobs' claims (a rewritten owner is not served)
            kv = ClaimedBucket(
                await open_streams(js, self.cfg.nats.subjects, self.cfg.retention), js, self.cfg.nats.subjects
            )
            owners = JobOwners(bool(self.cfg.api_keys), self.cfg.operator_keys)
            # POST /v1/jobs "sink": the jobs this gateway writes into the --job-sinks stores, and those no gateway writes
            self.sink_jobs = SinkJobs(
                js, kv, self.cfg.nats.subjects, SinkTargets(self.cfg.job_sinks, self.tables), self.nc.max_payload
            )
            self.sink_jobs.start()
            self.jobs = JobsApi(
                js,
                kv,
                self.cfg.nats.subjects,
                self.cfg.jobs_dir,
                self.tracer,
                owners,
                self.cfg.jobs_max_file_bytes,
                self.sink_jobs,
                self.key_limits,
                max_document_chars=self.cfg.max_document_chars,
                max_result_bytes=self.cfg.job_max_result_bytes,
                counted=self.metrics.key_tokens_of,
                image_limits=self.limits.images,
            )
            self.job_results = JobResultsApi(js, kv, self.cfg.nats.subjects, owners)
            # consumer lag and job progress, refreshed apart
            self.metrics.jobs.start(js, kv, self.cfg.nats.subjects, self.cfg.job_metrics_interval, owners.private)
        except Exception as exc:  # online requests are served without JetStream
            log.warning("job routes disabled: JetStream is not available (%s)", exc)
        log.info(
            "gateway on http://%s:%d (nats %s, default model: %s, search: %s)",
            self.cfg.host,
            self.cfg.port,
            self.cfg.nats.url,
            self.cfg.default_model or "the first served",
            self.searcher.store.shown if self.searcher else "not served",
        )
        mark_ready(self.cfg.nats, True)
        try:
            yield
        finally:
            mark_ready(self.cfg.nats, False)
            try:
                # graceful first, then no longer: a stop that hangs (a store, a JetStream call in flight)
                # must not keep the process alive, nor its port-taken exit from reaching `up`
                await asyncio.wait_for(self._shut_down(), _SHUTDOWN_SECONDS)
            except TimeoutError:
                log.warning("the gateway's shutdown took over %d s: leaving the rest to the exit", _SHUTDOWN_SECONDS)
            if exporter is not None:
                exporter.close()
            self.tracer.shutdown()

    async def _shut_down(self) -> None:
        """Stop what the lifespan started, in the reverse order, the NATS connection drained last."""
        await self._micro.stop()
        await self.discovery.stop()
        await self.client.stop()
        await self.metrics.jobs.stop()
        if self.sink_jobs is not None:
            await self.sink_jobs.stop()
        if self.jobs is not None:
            await self.jobs.stop()
        if self.searcher is not None:
            await self.searcher.store.close()
        await self.image_fetch.close()
        await drain_or_close(self.nc)

    # -- helpers ----------------------------------------------------------------------------

    @property
    def request_timeout(self) -> float:
        return self.cfg.request_timeout

    @property
    def max_payload(self) -> int:
        return self.nc.max_payload

    async def view(self) -> FleetView:
        return await self.discovery.view()

    def default_of(self, models: list[str]) -> str | None:
        """The model of requests that name none: the served id --default-model names, else the first by id."""
        if self.cfg.default_model is None:
            return models[0] if models else None
        return next((m for m in models if same_model(self.cfg.default_model, m)), None)

    async def resolve_model(self, requested: str | None) -> str:
        """The served id that ``requested`` names (None: the default model, see ``default_of``)."""
        view = await self.discovery.view()
        for fresh in (False, True):
            if fresh:
                view = await self.discovery.refresh()
            if requested is None and (default := self.default_of(view.models)) is not None:
                return default
            for model in view.models:
                if requested is not None and same_model(requested, model):
                    return model
        if not view.models:
            raise ApiError(ErrorCode.NO_RESPONDERS, "no tokenizer and worker are serving any model right now")
        if requested is None:  # a --default-model that is not served (yet, or no longer)
            raise ApiError(
                ErrorCode.NO_RESPONDERS,
                f"the default model {self.cfg.default_model!r} is not served right "
                f"now; available: {', '.join(view.models)} (name one as 'model')",
            )
        raise ApiError(
            ErrorCode.MODEL_NOT_FOUND,
            f"model {requested!r} is not served here; available: {', '.join(view.models)}",
            "model",
        )

    @contextlib.asynccontextmanager
    async def admitted(self) -> AsyncIterator[None]:
        """Service errors -> API errors (the request's slot among --max-in-flight is the middleware's)."""
        try:
            yield
        except ServiceError as exc:
            raise ApiError.of(exc) from None

    async def run_embed(
        self,
        model: str,
        inputs: Inputs,
        options: EmbedOptions,
        spans: Spans | None = None,
        rows: list[int] | None = None,
    ) -> EmbedOutcome:
        """``inputs`` embedded; ``spans``: with output "spans", each text's spans; ``rows``: the request's
        input each of ``inputs`` is of, when they are parts of its inputs (an input's error names it)."""
        view = await self.discovery.view()
        if view.workers.get(model, {}).get("task") == "score":
            raise ApiError(
                ErrorCode.INVALID_REQUEST,
                f"{model} is a cross-encoder: it scores (query, document) pairs "
                "through /rerank or /v1/rerank and makes no embeddings",
                "model",
            )
        if inputs.images is not None and "image" not in models_api.worker_inputs(view.workers.get(model, {})):
            raise ApiError(
                ErrorCode.INVALID_REQUEST, f"{model} embeds texts only: images need a two-tower model (CLIP)", "model"
            )
        dim = int(view.workers.get(model, {}).get("dim", 0))
        if options.dimensions is not None and dim and options.dimensions > dim:
            raise ApiError(
                ErrorCode.INVALID_REQUEST, f"'dimensions' {options.dimensions} exceeds the model's {dim}", "dimensions"
            )
        async with self.admitted():
            call = self.client.embed(
                model,
                inputs.texts,
                options,
                self.cfg.request_timeout,
                inputs.token_ids,
                spans=spans,
                images=inputs.images,
            )
            outcome = await (call if rows is None else part_of(call, rows))
        self.account(model, outcome)
        return outcome

    async def classify(
        self, model: str, texts: list[str], pairs: list[tuple[str, str]] | None, options: EmbedOptions, rows: list[int]
    ) -> EmbedOutcome:
        """A sequence classifier's logits of ``texts`` (or ``pairs``), the request's inputs ``rows``; the
        caller accounts them (``account``), once it has checked them."""
        async with self.admitted():
            call = self.client.embed(model, texts, options, self.cfg.request_timeout, pairs=pairs)
            return await part_of(call, rows)

    def account(self, model: str, outcome: EmbedOutcome) -> None:
        """An answered embedding's tokens: in the metrics, by model and by API key, and charged to the key."""
        self.metrics.observe_stages(model, outcome.tokens, outcome.timings)
        key = current_key()
        self.metrics.key_tokens_of(key, outcome.tokens)
        if key is not None:
            self.key_limits.charge(key, outcome.tokens)

    async def run_tokenize(
        self, model: str, texts: list[str], add_special_tokens: bool, prompt_name: str | None
    ) -> TokenizeResult:
        async with self.admitted():
            return await self.client.tokenize(model, texts, add_special_tokens, prompt_name, self.cfg.request_timeout)

    async def run_decode(self, model: str, ids: list[np.ndarray], skip_special_tokens: bool) -> list[str]:
        async with self.admitted():
            return await self.client.decode(model, ids, skip_special_tokens, self.cfg.request_timeout)

    @staticmethod
    def stage_headers(outcome: EmbedOutcome) -> dict[str, str]:
        return {
            header: str(round(outcome.timings[stage] * 1000))
            for stage, header in TIMING_HEADERS.items()
            if stage in outcome.timings
        }

    # -- OpenAI routes ----------------------------------------------------------------------

    async def embeddings(self, request: Request) -> Response:
        req = openai_api.parse_embeddings_request(await _read_body(request, self.cfg.max_body_bytes), self.limits)
        return await openai_serving.embeddings(self, req, request.headers.get("accept"), self.image_fetch)

    async def embed_texts(
        self, model: str, inputs: Inputs, options: EmbedOptions, chunking: Chunking | None
    ) -> tuple[EmbedOutcome, list | None, str]:
        """``inputs`` embedded whole, or cut into chunks when the request asks: the outcome, each input's
        chunks when the rows are the chunks' (None: a row per input, ``"mean"`` included), the rows' form."""
        if chunking is None:
            outcome = await self.run_embed(model, inputs, options)
            return outcome, None, rows_form(options.form, outcome.form)
        if inputs.images is not None:
            raise ApiError(ErrorCode.INVALID_REQUEST, "'chunking' cuts texts; these inputs are images", "chunking")
        outcome, chunks, form = await self.run_chunked(model, inputs.texts, options, chunking)
        return outcome, None if chunking.returns == "mean" else chunks, form

    async def run_chunked(
        self, model: str, texts: list[str], options: EmbedOptions, chunking: Chunking
    ) -> tuple[EmbedOutcome, list, str]:
        """``texts`` cut into chunks (a tokenizer says where), the chunks embedded (their texts, or late: from
        windows of the texts): the outcome with a row per chunk (``"chunks"``) or per input (``"mean"``),
        each input's chunks, and the rows' form."""
        if chunking.late:
            late_chunking.check_model(model, (await self.discovery.view()).workers.get(model, {}))
        mean = chunking.returns == "mean"
        async with self.admitted():
            layout = await self.client.chunk(model, texts, chunking.spec, options, self.cfg.request_timeout)
        floats = (
            dataclasses.replace(options, dtype=FLOAT32.wire) if mean else options
        )  # averaged in float32, then made the asked form
        if chunking.late:
            outcome, chunks = await self.run_late(model, texts, layout, floats)
        else:
            pieces, chunks = chunk_texts(texts, layout)
            outcome = await self.run_embed(model, Inputs(pieces, None), floats)
        form = rows_form(floats.form, outcome.form)
        if mean:  # normalised as the chunks were: TEI's 'normalize' when sent, else the model's rule
            normalize = (
                options.normalize
                if options.normalize is not None
                else ((await self.discovery.view()).workers.get(model, {}).get("normalize", "true") == "true")
            )
            vectors = mean_of_chunks(outcome.vectors, chunks, normalize)
            form = options.form
            outcome = dataclasses.replace(outcome, vectors=quantize(vectors, form))
        return outcome, chunks, form

    async def run_late(
        self, model: str, texts: list[str], layout: ChunkLayout, options: EmbedOptions
    ) -> tuple[EmbedOutcome, list]:
        """The chunks of ``layout`` late-chunked (services/gateway/late_chunking.py): the outcome with a
        row per chunk, and each input's chunks."""
        late, chunks = late_chunking.plan(texts, layout)
        spans = dataclasses.replace(options, output="spans", truncate=False)
        outcome = await self.run_embed(model, Inputs(late.texts, None), spans, late.spans, late.inputs)
        return dataclasses.replace(
            outcome, vectors=late_chunking.chunk_rows(outcome.ragged_rows(), late), ragged=None
        ), chunks

    async def models(self, request: Request) -> Response:
        view = await self.discovery.view()
        return json_response(
            models_api.render_models(
                view.models,
                view.tokenizers,
                view.workers,
                self.default_of(view.models),
                self.searcher.card() if self.searcher else None,
            )
        )

    async def search(self, request: Request) -> Response:
        """POST /v1/search (services/gateway/search/serving.py)."""
        if self.searcher is None:
            raise ApiError(ErrorCode.NOT_FOUND, NOT_SERVED)
        call = search_api.parse_search(await _read_body(request, self.cfg.max_body_bytes), self.limits)
        return await self.searcher.answer(self, call)

    # -- TEI routes -------------------------------------------------------------------------

    async def embed(self, request: Request) -> Response:
        body = await _read_body(request, self.cfg.max_body_bytes)
        req = tei_api.parse_embed(body, self.limits)
        return await tei_serving.embed(self, req, await self.resolve_model(req.model), request.headers.get("accept"))

    async def embed_sparse(self, request: Request) -> Response:
        body = await _read_body(request, self.cfg.max_body_bytes)
        req = tei_api.parse_embed_sparse(body, self.limits)
        return await tei_serving.embed_sparse(self, req, await self.resolve_model(req.model))

    async def embed_all(self, request: Request) -> Response:
        body = await _read_body(request, self.cfg.max_body_bytes)
        return await tei_serving.embed_all(self, tei_api.read_embed_all(body), self.limits, self.image_fetch)

    async def run_rerank(self, call: rerank_api.RerankCall, request_id: str) -> tuple[str, RerankResult]:
        """``call`` ranked by its model's scorer, or by MaxSim here for a multi-vector model (rerank/late.py)."""
        model = await self.resolve_model(call.model)
        worker = (await self.discovery.view()).workers.get(model, {})
        if rerank_late.by_maxsim(worker):
            return model, await rerank_late.rerank(self, model, worker, call, request_id)
        rerank_late.texts_only(call, model)
        deadline = time.time() + self.cfg.request_timeout
        request = RerankRequest(
            request_id, model, call.query, call.texts, deadline, call.top_n, call.raw_scores, call.truncate
        )
        async with self.admitted():
            ranked = await self.client.rerank(request, self.cfg.request_timeout)
        if (key := current_key()) is not None:  # the scorer counts no tokens: its pairs' estimate is charged
            self.key_limits.charge(key, estimated_tokens(call.query + text for text in call.texts))
        return model, ranked

    async def rerank_tei(self, request: Request) -> Response:
        call = tei_tasks.parse_rerank(await _read_body(request, self.cfg.max_body_bytes), self.limits)
        return await rerank_serving.rerank_tei(self, call)

    async def rerank_cohere(self, request: Request) -> Response:
        call = rerank_api.parse_cohere(await _read_body(request, self.cfg.max_body_bytes), self.limits)
        return await rerank_serving.rerank_cohere(self, call)

    # -- Cohere routes ----------------------------------------------------------------------

    async def cohere_embed_v1(self, request: Request) -> Response:
        return await self._cohere_embed(request, 1)

    async def cohere_embed_v2(self, request: Request) -> Response:
        return await self._cohere_embed(request, 2)

    async def _cohere_embed(self, request: Request, version: int) -> Response:
        req = cohere_api.parse_embed(await _read_body(request, self.cfg.max_body_bytes), self.limits, version)
        return await cohere_serving.embed(self, req, self.image_fetch)

    async def rerank_cohere_v2(self, request: Request) -> Response:
        req = cohere_api.parse_rerank(await _read_body(request, self.cfg.max_body_bytes), self.limits)
        return await cohere_serving.rerank_v2(self, req)

    async def tokenize(self, request: Request) -> Response:
        req = tei_api.parse_tokenize(await _read_body(request, self.cfg.max_body_bytes), self.limits)
        return await tei_serving.tokenize(self, req)

    async def info(self, request: Request) -> Response:
        """GET /info, of the model ``?model=ID`` names (a GET has no body), else of the default model."""
        return await tei_serving.info(self, request.query_params.get("model"), self.limits, self.cfg.max_in_flight)

    # -- TEI task routes: /predict, /similarity, /decode, and POST / by the model's kind ------

    async def predict(self, request: Request) -> Response:
        call = tei_tasks.parse_predict(await _read_body(request, self.cfg.max_body_bytes), self.limits)
        return await tei_task_serving.predict(self, call, await self.resolve_model(call.model))

    async def similarity(self, request: Request) -> Response:
        call = tei_tasks.parse_similarity(await _read_body(request, self.cfg.max_body_bytes), self.limits)
        return await tei_task_serving.similarity(self, call, await self.resolve_model(call.model))

    async def decode(self, request: Request) -> Response:
        call = tei_tasks.parse_decode(await _read_body(request, self.cfg.max_body_bytes), self.limits)
        return await tei_task_serving.decode(self, call)

    async def root(self, request: Request) -> Response:
        """POST / (and /invocations): the task of the model's kind (services/gateway/tei/task_serving.py)."""
        body = await _read_body(request, self.cfg.max_body_bytes)
        return await tei_task_serving.root(self, body, self.limits, request.headers.get("accept"))

    # -- bulk jobs --------------------------------------------------------------------------

    async def create_job(self, request: Request) -> Response:
        return await jobs_serving.create(self, lambda: _read_body(request, self.cfg.max_body_bytes))

    async def list_jobs(self, request: Request) -> Response:
        return await jobs_serving.page(self, parse_listing(request.query_params))

    async def job_state(self, request: Request) -> Response:
        return await jobs_serving.state(self, request.path_params["job"])

    async def job_vectors(self, request: Request) -> Response:
        return await jobs_serving.results(self, request.path_params["job"], request.headers.get("accept"))

    async def cancel_job(self, request: Request) -> Response:
        return await jobs_serving.cancel(self, request.path_params["job"])

    # -- operations -------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        """Liveness, or with ``?model=ID`` / ``?all=1`` readiness of models (services/gateway/http/health.py)."""
        ask = health.parse_readiness(request.query_params)
        view = await self.discovery.refresh(until_ready=ask.plain)
        if ask.plain and not view.models and view.tokenizers and view.workers:
            # the first tokenizer and the first worker to answer were of different models: ask them all
            view = await self.discovery.refresh()
        body, status = health.health_answer(view, ask)
        return json_response(body, status=status)

    async def prometheus(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    async def openapi(self, request: Request) -> Response:
        return json_response(openapi_spec(__version__))


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(ErrorCode.PAYLOAD_TOO_LARGE, f"request body is over the {limit} byte limit")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise ApiError(ErrorCode.PAYLOAD_TOO_LARGE, f"request body is over the {limit} byte limit")
    return bytes(body)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response(request.url.path)


async def _protocol_error(request: Request, exc: Exception) -> Response:
    """A request whose fields make a message the wire protocol refuses: the request is at fault (the
    routes check their fields first; this is the net under them)."""
    log.warning("request on %s made an invalid message: %s", request.url.path, exc)
    return error_response(
        request.url.path, ErrorCode.INVALID_REQUEST, f"invalid request: {str(exc).replace('options.', '')}"
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _ROUTING.get(exc.status_code, ErrorCode.INVALID_REQUEST if exc.status_code < 500 else ErrorCode.INTERNAL)
    return error_response(request.url.path, code, str(exc.detail))


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)  # noqa: LOG004 (starlette calls it in its except)
    return error_response(request.url.path, ErrorCode.INTERNAL, "internal error")


def create_app(cfg: GatewayConfig) -> GatewayMiddleware:
    metrics = Metrics(cfg.key_id_secret)
    if cfg.api_keys:  # which id is which key: by their places in --api-keys, --api-keys-file, then the operator keys'
        ids = ", ".join(f"#{i} {metrics.key_name(key)}" for i, key in enumerate(cfg.api_keys, 1))
        log.info("API keys' ids in metrics: %s", ids)
    gw = Gateway(cfg, metrics)
    routes = [Route(spec.path, getattr(gw, spec.handler), methods=[spec.method]) for spec in ROUTES]
    handlers = {
        ApiError: _api_error,
        ProtocolError: _protocol_error,
        HTTPException: _http_error,
        Exception: _unexpected,
    }
    app = Starlette(routes=routes, lifespan=gw.lifespan, exception_handlers=handlers)
    return GatewayMiddleware(
        app,
        keys=ApiKeys(cfg.api_keys, cfg.open_paths),
        metrics=metrics,
        routes=PATHS,
        tracer=gw.tracer,
        limits=gw.key_limits,
        admission=Admission(cfg.max_in_flight, metrics.in_flight),
        endpoints=Endpoints(routes, handlers),
        browser=BrowserGuard(rules_of(cfg.allowed_hosts, cfg.allowed_origins, cfg.host)),
    )


def serve(cfg: GatewayConfig, log_level: str) -> None:
    import uvicorn

    from embedfleet.services.gateway.http import server as http_server
    from embedfleet.services.gateway.http import uvicorn as uvicorn_server

    uvicorn_server.run(
        uvicorn.Config(
            create_app(cfg),
            host=cfg.host,
            port=cfg.port,
            log_config=None,  # uvicorn's lines go through the process's handler, in its --log-format
            log_level=log_level,
            access_log=log_level == "debug",
            timeout_graceful_shutdown=30,
            # limits on headers and slow clients; uvicorn takes a protocol class or its name, and calls it to make
            # one: a factory with the limits bound is as good, which its annotation cannot say
            http=http_server.protocol(cfg.http),  # type: ignore[arg-type]
        )
    )
