"""The rerank routes' work through the fleet: TEI's POST /rerank and the Cohere/Jina POST /v1/rerank, each
call (api.py) ranked (by the model's scorer, or by MaxSim for a multi-vector model: late.py) and answered
in its API's shape."""

from __future__ import annotations

import uuid

from starlette.responses import Response

from embedfleet.services.gateway.core import Embedder
from embedfleet.services.gateway.rerank import api as rerank_api


async def rerank_tei(fleet: Embedder, call: rerank_api.RerankCall) -> Response:
    _, ranked = await fleet.run_rerank(call, uuid.uuid4().hex)
    return Response(rerank_api.render_tei(call, ranked.indices, ranked.scores), media_type="application/json")


async def rerank_cohere(fleet: Embedder, call: rerank_api.RerankCall) -> Response:
    request_id = uuid.uuid4().hex
    model, ranked = await fleet.run_rerank(call, request_id)
    return Response(
        rerank_api.render_cohere(call, model, request_id, ranked.indices, ranked.scores),
        media_type="application/json",
    )
