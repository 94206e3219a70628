"""The TEI task routes' work through the fleet: /predict (a sequence classifier's label scores),
/similarity, /decode, and ``POST /`` (and /invocations), which runs the task of the model's kind as TEI
mounts it; each request (tasks.py) answered in TEI's shape."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
from starlette.responses import Response

from embedfleet.services.gateway.core import Embedder
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.inputs import Limits, json_object, optional
from embedfleet.services.gateway.rerank import serving as rerank_serving
from embedfleet.services.gateway.tei import api as tei_api
from embedfleet.services.gateway.tei import serving as tei_serving
from embedfleet.services.gateway.tei import tasks as tei_tasks
from embedfleet.shared.errors import ErrorCode


async def predict(fleet: Embedder, call: tei_tasks.PredictCall, model: str) -> Response:
    worker = (await fleet.view()).workers.get(model, {})
    if worker.get("task") != "score":
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"{model} is not a sequence classifier; /predict scores texts with one (embedders answer /embed)",
            "model",
        )
    pairs = [i for i, x in enumerate(call.inputs) if not isinstance(x, str)]
    singles = [i for i, x in enumerate(call.inputs) if isinstance(x, str)]
    texts = [x for x in call.inputs if isinstance(x, str)]  # singles' inputs, in their order
    both = [x for x in call.inputs if not isinstance(x, str)]  # pairs'
    groups = [(rows, is_pair) for rows, is_pair in ((singles, False), (pairs, True)) if rows]
    # single texts and pairs travel as two requests, scored at once
    outcomes = await asyncio.gather(
        *(
            fleet.classify(model, [] if is_pair else texts, both if is_pair else None, call.options, rows)
            for rows, is_pair in groups
        )
    )
    labels = tei_tasks.worker_labels(worker)
    logits = np.empty((len(call.inputs), len(labels)), dtype=np.float32)
    for (rows, _), outcome in zip(groups, outcomes):
        if outcome.vectors.shape[1] != len(labels):
            raise ApiError(
                ErrorCode.INTERNAL, f"the model gave {outcome.vectors.shape[1]} logits for {len(labels)} labels"
            )
        logits[rows] = outcome.vectors
        fleet.account(model, outcome)
    body = tei_tasks.render_predict(call, tei_tasks.label_scores(logits, call.raw_scores), labels)
    slowest = max(outcomes, key=lambda o: sum(o.timings.values()))
    return Response(body, media_type="application/json", headers=fleet.stage_headers(slowest))


async def similarity(fleet: Embedder, call: tei_tasks.SimilarityCall, model: str) -> Response:
    outcome = await fleet.run_embed(model, call.inputs, call.options)
    return Response(
        tei_tasks.render_similarity(outcome.vectors),
        media_type="application/json",
        headers=fleet.stage_headers(outcome),
    )


async def decode(fleet: Embedder, call: tei_tasks.DecodeCall) -> Response:
    model = await fleet.resolve_model(call.model)
    if vocab := int((await fleet.view()).tokenizers.get(model, {}).get("vocab_size", 0)):
        tei_tasks.check_vocabulary(call.ids, vocab)
    texts = await fleet.run_decode(model, call.ids, call.skip_special_tokens)
    return Response(tei_tasks.render_decode(texts), media_type="application/json")


async def root(fleet: Embedder, body: bytes, limits: Limits, accept: str | None) -> Response:
    """POST / (and /invocations): the task of the model's kind, as TEI mounts it; a sentence-similarity
    body runs /similarity whatever the model (huggingface_hub's InferenceClient posts both here)."""
    doc = json_object(body)  # the model and the task, read before the task's typed body reads it all
    model = await fleet.resolve_model(optional(doc, "model", str))
    task = tei_tasks.root_task(doc, (await fleet.view()).workers.get(model, {}))
    if task == "similarity":
        return await similarity(fleet, tei_tasks.parse_similarity(body, limits), model)
    if task == "predict":
        return await predict(fleet, tei_tasks.parse_predict(body, limits), model)
    if task == "rerank":
        call = dataclasses.replace(tei_tasks.parse_rerank(body, limits), model=model)
        return await rerank_serving.rerank_tei(fleet, call)
    if task == "embed_sparse":
        return await tei_serving.embed_sparse(fleet, tei_api.parse_embed_sparse(body, limits), model, checked=False)
    return await tei_serving.embed(fleet, tei_api.parse_embed(body, limits), model, accept)
