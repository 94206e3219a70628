"""What GET /health (and TEI's names for it, GET / and /ping) answers, as typed models: /openapi.json's
response schemas are made from them, and the tests hold what health.py's ``health_answer`` writes to
them (the route writes with orjson)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from embedfleet.services.gateway.response_parts import ANSWER, omitted


class Healthy(BaseModel):
    """200: a tokenizer and a worker of a model answer (with ?model / ?all: of each model asked for)."""

    model_config = ANSWER

    status: Literal["ok"]
    models: list[str] = Field(
        description="the models served (plain: those whose processes answered first; ?model / ?all: every one)"
    )


class Unhealthy(BaseModel):
    """503: TEI's error body, with what the fleet lacks beside it (on every health path, whatever its API)."""

    model_config = ANSWER

    status: Literal["unavailable"]
    error: str = Field(description="what is missing")
    error_type: Literal["Unhealthy"]
    tokenizers: list[str] = Field(description="the models a live tokenizer announces")
    workers: list[str] = Field(description="the models a live worker announces")
    waiting: list[str] = omitted("with ?model or ?all: the models not served yet")
