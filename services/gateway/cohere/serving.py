"""The Cohere routes' work through the fleet: POST /v1/embed and /v2/embed embedded (whole or in chunks)
within the model's limits, POST /v2/rerank ranked by the scorer (a multi-vector model: by MaxSim,
rerank/late.py); each answered in Cohere's shape (api.py)."""

from __future__ import annotations

import uuid

from starlette.responses import Response

from embedfleet.services.gateway import images
from embedfleet.services.gateway.cohere import api as cohere_api
from embedfleet.services.gateway.core import Embedder
from embedfleet.services.gateway.http.formats import rows_form
from embedfleet.services.gateway.image_fetch import ImageFetcher


async def embed(fleet: Embedder, req: cohere_api.CohereEmbed, fetch: ImageFetcher) -> Response:
    """``fetch``: the images ``req`` names by URL are fetched through it, once the model's limits are checked."""
    model = await fleet.resolve_model(req.model)
    view = await fleet.view()
    cohere_api.check_model_limits(
        "max_tokens",
        req.max_tokens,
        int(view.tokenizers.get(model, {}).get("max_seq_length", 0)),
        req.dimensions,
        int(view.workers.get(model, {}).get("dim", 0)),
    )
    if req.image_urls:
        req = cohere_api.with_fetched(req, await fetch.checked(req.image_urls))
    if req.images is None:
        outcome, chunks, form = await fleet.embed_texts(model, req.inputs, req.options(), req.chunking)
    else:
        outcome, chunks = (
            await images.embed_with_images(fleet, model, req.inputs, req.images, req.image_rows, req.options()),
            None,
        )
        form = rows_form(req.options().form, outcome.form)
    body = cohere_api.render_embed(req, str(uuid.uuid4()), outcome.vectors, form, outcome.tokens, chunks)
    return Response(body, media_type="application/json", headers=fleet.stage_headers(outcome))


async def rerank_v2(fleet: Embedder, req: cohere_api.CohereRerank) -> Response:
    model = await fleet.resolve_model(req.call.model)
    view = await fleet.view()
    cohere_api.check_model_limits(
        "max_tokens_per_doc", req.max_tokens_per_doc, int(view.tokenizers.get(model, {}).get("max_seq_length", 0))
    )
    request_id = str(uuid.uuid4())
    _, ranked = await fleet.run_rerank(req.call, request_id)
    return Response(cohere_api.render_rerank(request_id, ranked.indices, ranked.scores), media_type="application/json")
