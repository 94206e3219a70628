"""POST /v1/embeddings' work through the fleet: the request (api.py) embedded, whole or in chunks, and
answered in JSON, or as bytes when the Accept header asks for them."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
from starlette.responses import Response

from embedfleet.services.gateway.core import Embedder
from embedfleet.services.gateway.http.formats import binary_answer, rows_form
from embedfleet.services.gateway.openai import api as openai_api
from embedfleet.shared.nats.embed_client import EmbedOutcome
from embedfleet.shared.protocol import EmbedOptions
from embedfleet.shared.vectors.forms import FORMS


async def _with_images(
    fleet: Embedder, model: str, req: openai_api.EmbeddingsRequest, options: EmbedOptions
) -> EmbedOutcome:
    """A request with {'image': ...} items: its images, and its texts beside them, embedded side by side
    (each through its tower) and their rows put back in the order of ``input``."""
    assert req.images is not None  # called for a request with images
    image_rows = list(req.image_rows)
    if not req.inputs.count:
        return await fleet.run_embed(model, req.images, options, rows=image_rows)
    is_image = np.zeros(req.inputs.count + req.images.count, dtype=bool)
    is_image[image_rows] = True
    texts, images = await asyncio.gather(
        fleet.run_embed(model, req.inputs, options, rows=np.flatnonzero(~is_image).tolist()),
        fleet.run_embed(model, req.images, options, rows=image_rows),
    )
    vectors = np.empty((len(is_image), *texts.vectors.shape[1:]), dtype=texts.vectors.dtype)
    vectors[~is_image], vectors[is_image] = texts.vectors, images.vectors
    timings = {
        k: max(texts.timings.get(k, 0.0), images.timings.get(k, 0.0)) for k in {**texts.timings, **images.timings}
    }
    return dataclasses.replace(texts, vectors=vectors, tokens=texts.tokens + images.tokens, timings=timings)


async def embeddings(fleet: Embedder, req: openai_api.EmbeddingsRequest, accept: str | None) -> Response:
    model = await fleet.resolve_model(req.model)
    options = EmbedOptions(
        dimensions=req.dimensions, input_type=req.input_type, dtype=FORMS[req.embedding_type].wire, task=req.task
    )
    if req.images is None:
        outcome, chunks, form = await fleet.embed_texts(model, req.inputs, options, req.chunking)
    else:
        outcome, chunks = await _with_images(fleet, model, req, options), None
        form = rows_form(options.form, outcome.form)
    headers = fleet.stage_headers(outcome)
    if (binary := binary_answer(accept, model, outcome, form, chunks, headers)) is not None:
        return binary
    body = openai_api.render_embeddings(model, outcome.vectors, outcome.tokens, req.encoding_format, form, chunks)
    return Response(body, media_type="application/json", headers=headers)
