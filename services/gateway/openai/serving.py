"""POST /v1/embeddings' work through the fleet: the request (api.py) embedded, whole or in chunks, and
answered in JSON, or as bytes when the Accept header asks for them."""

from __future__ import annotations

from starlette.responses import Response

from embedfleet.services.gateway import images
from embedfleet.services.gateway.core import Embedder
from embedfleet.services.gateway.http.formats import binary_answer, rows_form
from embedfleet.services.gateway.image_fetch import ImageFetcher
from embedfleet.services.gateway.openai import api as openai_api
from embedfleet.shared.protocol import EmbedOptions
from embedfleet.shared.vectors.forms import FORMS


async def embeddings(
    fleet: Embedder, req: openai_api.EmbeddingsRequest, accept: str | None, fetch: ImageFetcher
) -> Response:
    """``fetch``: the images ``req`` names by URL are fetched through it, once its model is known."""
    model = await fleet.resolve_model(req.model)
    options = EmbedOptions(
        dimensions=req.dimensions, input_type=req.input_type, dtype=FORMS[req.embedding_type].wire, task=req.task
    )
    if req.images is None:
        outcome, chunks, form = await fleet.embed_texts(model, req.inputs, options, req.chunking)
    else:
        shown = await fetch.completed(req.images, req.image_urls)
        outcome = await images.embed_with_images(fleet, model, req.inputs, shown, req.image_rows, options)
        chunks = None
        form = rows_form(options.form, outcome.form)
    headers = fleet.stage_headers(outcome)
    if (binary := binary_answer(accept, model, outcome, form, chunks, headers)) is not None:
        return binary
    body = openai_api.render_embeddings(model, outcome.vectors, outcome.tokens, req.encoding_format, form, chunks)
    return Response(body, media_type="application/json", headers=headers)
