"""The TEI embedding routes' work through the fleet: /embed (whole or in chunks; bytes when the Accept
header asks), /embed_sparse, /embed_all, /tokenize and GET /info, each request (api.py) answered in TEI's
shape; the task routes' work is task_serving.py's."""

from __future__ import annotations

from starlette.responses import Response

from embedfleet.services.gateway.core import Embedder, offers
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.http.formats import binary_answer
from embedfleet.services.gateway.image_fetch import ImageFetcher
from embedfleet.services.gateway.images import embed_with_images
from embedfleet.services.gateway.inputs import Limits
from embedfleet.services.gateway.tei import api as tei_api
from embedfleet.services.gateway.tei.body import EmbedAllBody
from embedfleet.shared import __version__
from embedfleet.shared.errors import ErrorCode


async def embed(fleet: Embedder, req: tei_api.EmbedRequest, model: str, accept: str | None) -> Response:
    outcome, chunks, form = await fleet.embed_texts(model, req.inputs, req.options, req.chunking)
    headers = fleet.stage_headers(outcome)
    if (binary := binary_answer(accept, model, outcome, form, chunks, headers)) is not None:
        return binary
    body = (
        tei_api.render_embed(outcome.vectors, form)
        if chunks is None
        else tei_api.render_embed_chunks(outcome.vectors, form, chunks)
    )
    return Response(body, media_type="application/json", headers=headers)


async def embed_sparse(fleet: Embedder, req: tei_api.EmbedRequest, model: str, checked: bool = True) -> Response:
    """``req``'s sparse vectors; ``checked``: the model is first asked whether it makes them (POST / asks
    not, having chosen the task by the model's kind)."""
    if checked and "sparse" not in await offers(fleet, model):
        raise ApiError(ErrorCode.INVALID_REQUEST, f"{model} makes no sparse vectors (serve a SPLADE or BGE-M3 model)")
    outcome = await fleet.run_embed(model, req.inputs, req.options)
    return Response(
        tei_api.render_sparse(outcome.ragged_rows()),
        media_type="application/json",
        headers=fleet.stage_headers(outcome),
    )


async def embed_all(fleet: Embedder, doc: EmbedAllBody, limits: Limits, fetch: ImageFetcher) -> Response:
    """``fetch``: the images ``doc`` names by URL are fetched through it, once the request is parsed."""
    model = await fleet.resolve_model(doc.model)
    req = tei_api.parse_embed_all(doc, limits, await offers(fleet, model))
    if req.images is not None:
        shown = await fetch.completed(req.images, req.image_urls)
        outcome = await embed_with_images(fleet, model, req.inputs, shown, req.image_rows, req.options)
    else:
        outcome = await fleet.run_embed(model, req.inputs, req.options)
    form = req.options.form
    return Response(
        tei_api.render_all(outcome.ragged_rows(), form),
        media_type="application/json",
        headers=fleet.stage_headers(outcome),
    )


async def tokenize(fleet: Embedder, req: tei_api.TokenizeRequest) -> Response:
    model = await fleet.resolve_model(req.model)
    result = await fleet.run_tokenize(model, req.texts, req.add_special_tokens, req.prompt_name)
    return Response(tei_api.render_tokens(result), media_type="application/json")


async def info(fleet: Embedder, requested: str | None, limits: Limits, max_in_flight: int) -> Response:
    """GET /info of the model ``requested`` names (None: the default model): its tokenizer's and workers'
    registrations, the gateway's ``limits`` on a request and its ``max_in_flight`` (--max-in-flight)."""
    model = await fleet.resolve_model(requested)
    view = await fleet.view()
    body = tei_api.render_info(
        model,
        view.tokenizers.get(model, {}),
        view.workers.get(model, {}),
        limits,
        max_in_flight,
        __version__,
    )
    return Response(body, media_type="application/json")
