"""GET /health (and GET /, /ping): liveness of the fleet behind the gateway, and readiness of its models
(no I/O here).

Plain, it answers 200 while a tokenizer and a worker of some model answer (TEI's /health). A stack of
several models comes up one model at a time (``embedfleet up`` starts the workers one after another), so
readiness for all of them is asked for apart, without changing that meaning:

- ``?model=ID`` (repeatable): 200 only when each named model has a live tokenizer and worker;
- ``?all=1``: 200 only when no model is half served, i.e. every model a live tokenizer or worker
  announces has both (and at least one model is served).
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.datastructures import QueryParams

from embedfleet.services.gateway.http.errors import TABLE, ApiError
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.model_dir.info import same_model
from embedfleet.shared.nats.fleet import FleetView

_OFF = ("0", "false")


@dataclass(frozen=True, slots=True)
class Readiness:
    models: tuple[str, ...]  # the models asked for by name
    every: bool  # every model announced, none half served

    @property
    def plain(self) -> bool:
        """TEI's check: any model served."""
        return not self.models and not self.every


def parse_readiness(params: QueryParams) -> Readiness:
    models = tuple(params.getlist("model"))
    if any(not m for m in models):
        raise ApiError(ErrorCode.INVALID_REQUEST, "'model' must name a model", "model")
    every = params.get("all")
    return Readiness(models, every is not None and every.lower() not in _OFF)


def waiting_for(view: FleetView, ask: Readiness) -> list[str]:
    """The models a ready answer still waits for: named ones not served, and (``every``) each model
    with a live tokenizer but no worker, or a worker but no tokenizer."""
    missing = [m for m in ask.models if not any(same_model(m, served) for served in view.models)]
    if ask.every:
        missing += sorted((set(view.tokenizers) ^ set(view.workers)) - set(missing))
    return missing


def health_answer(view: FleetView, ask: Readiness) -> tuple[dict, int]:
    """The body and status of /health for the fleet seen in ``view``."""
    waiting = waiting_for(view, ask)
    if view.models and not waiting:
        return {"status": "ok", "models": view.models}, 200
    if waiting:
        error = f"not served yet (a tokenizer and a worker each): {', '.join(waiting)}"
    else:
        error = (
            "no "
            + (
                "tokenizer"
                if not view.tokenizers
                else "worker"
                if not view.workers
                else "tokenizer and worker of one model"
            )
            + " answers"
        )
    unhealthy = TABLE[ErrorCode.NO_RESPONDERS]
    body = {
        "status": "unavailable",
        "error": error,
        "error_type": unhealthy.tei_type,  # TEI's error body, with what is missing beside it
        "tokenizers": sorted(view.tokenizers),
        "workers": sorted(view.workers),
    }
    if not ask.plain:
        body["waiting"] = waiting
    return body, unhealthy.status
