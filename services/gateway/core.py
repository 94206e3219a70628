"""What an API family's routes ask of the fleet behind the gateway: a model resolved, texts embedded, pairs
reranked, the fleet's current view. ``Gateway`` (app.py) is the one implementation; a family module types
against ``Embedder`` instead of importing the application, so the application can import the families and
none of them imports it back (and a test can hand a family a small stand-in)."""

from __future__ import annotations

from typing import Protocol

from embedfleet.services.gateway.inputs import Inputs
from embedfleet.services.gateway.rerank.api import RerankCall
from embedfleet.shared.nats.embed_client import EmbedOutcome
from embedfleet.shared.nats.fleet import FleetView
from embedfleet.shared.protocol import EmbedOptions, RerankResult, Spans


class Embedder(Protocol):
    """Embedding and reranking through the fleet, each call admitted, accounted and its errors the API's."""

    @property
    def request_timeout(self) -> float:
        """Seconds a request's work through the fleet may take (--request-timeout)."""
        ...

    async def view(self) -> FleetView:
        """The models, tokenizers and workers the gateway sees now."""
        ...

    async def resolve_model(self, requested: str | None) -> str:
        """The served id ``requested`` names (None: the default model); ApiError when none is served."""
        ...

    async def run_embed(
        self,
        model: str,
        inputs: Inputs,
        options: EmbedOptions,
        spans: Spans | None = None,
        rows: list[int] | None = None,
    ) -> EmbedOutcome:
        """``inputs`` embedded by ``model``, the tokens charged to the request's API key."""
        ...

    async def run_rerank(self, call: RerankCall, request_id: str) -> tuple[str, RerankResult]:
        """``call``'s texts ranked against its query: the model that ranked them, and the ranking."""
        ...

    def stage_headers(self, outcome: EmbedOutcome) -> dict[str, str]:
        """The response headers of ``outcome``'s stage timings (milliseconds)."""
        ...
