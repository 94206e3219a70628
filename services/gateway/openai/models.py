"""``GET /v1/models``: OpenAI's model list, each entry extended with what the model does and its limits.

Everything comes from the metadata the live tokenizers and workers register (NATS micro-service
info), so the list is what the fleet serves right now, not a static file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

KINDS = ("embedding", "sparse", "multivector", "rerank", "classify")


def model_kind(task: str, dim: int, outputs: Sequence[str]) -> str:
    """What a model serves: a one-label cross-encoder reranks, one with several labels classifies; an
    embedder that makes dense vectors makes embeddings (/v1/embeddings), one without them makes sparse
    vectors (/embed_sparse) or else only token vectors (ColBERT: /embed_all)."""
    if task == "score":
        return "rerank" if dim == 1 else "classify"
    if "dense" in outputs or not outputs:
        return "embedding"
    return "sparse" if "sparse" in outputs else "multivector"


def worker_kind(worker: Mapping[str, str]) -> str:
    """The kind of the model a live worker serves, from what it registered (``model_kind``)."""
    return model_kind(worker.get("task", "embed"), _int(worker.get("dim")) or 0, _outputs(worker))


def worker_inputs(worker: Mapping[str, str]) -> list[str]:
    """What a live worker's model embeds: ["text"], or ["text", "image"] for a two-tower model."""
    return [i for i in (worker.get("inputs") or "text").split(",") if i]


def _outputs(worker: Mapping[str, str]) -> list[str]:
    return [o for o in (worker.get("outputs") or "dense").split(",") if o]


def model_card(model: str, tokenizer: Mapping[str, str], worker: Mapping[str, str], default: bool) -> dict[str, object]:
    """One ``data`` entry: OpenAI's fields, then ``kind``, ``dimensions`` (a vector's length: the
    vocabulary for sparse, the number of labels for rerank / classify), ``max_tokens`` (special tokens
    included), ``outputs``, ``inputs`` (what it embeds: text, image), ``prompts`` (names a request's ``input_type`` / ``prompt_name`` may
    choose), ``tasks`` (the task adapters a request's ``task`` may choose), ``default`` (the model of requests that name none) and, for a classifier, ``labels``
    (its label names, by logit)."""
    outputs = _outputs(worker)
    dim = _int(worker.get("dim"))
    kind = worker_kind(worker)
    card: dict[str, object] = {
        "id": model,
        "object": "model",
        "created": 0,
        "owned_by": "embedfleet",
        "kind": kind,
        "dimensions": dim,
        "max_tokens": _int(tokenizer.get("max_seq_length")),
        "outputs": outputs,
        "inputs": worker_inputs(worker),
        "prompts": [p for p in (tokenizer.get("prompts") or "").split(",") if p],
        "tasks": [t for t in (tokenizer.get("tasks") or "").split(",") if t],
        "default": default,
    }
    labels = _labels(worker.get("labels"))
    if kind == "classify" and labels is not None:
        card["labels"] = labels
    return card


def render_models(
    models: Sequence[str],
    tokenizers: Mapping[str, Mapping[str, str]],
    workers: Mapping[str, Mapping[str, str]],
    default: str | None,
    search: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """The list; ``search``: what ``POST /v1/search`` searches (``Search.card``), when the gateway serves it."""
    data = [model_card(m, tokenizers.get(m, {}), workers.get(m, {}), m == default) for m in models]
    return {"object": "list", "data": data, **({"search": dict(search)} if search is not None else {})}


def _labels(text: str | None) -> list[str] | None:
    """Label names, registered as a JSON list (names may hold commas)."""
    try:
        labels = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return [str(x) for x in labels] if isinstance(labels, list) else None


def _int(text: str | None) -> int | None:
    """A metadata number; None where the process did not say (an older version) or said nonsense."""
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
