"""What an API family's routes ask of the fleet behind the gateway (``Embedder``): a model resolved, texts
embedded, pairs reranked, the fleet's current view; and what a model's workers offer. ``Gateway`` (app.py) is
the one implementation; a family's work (``<family>/serving.py``) types against ``Embedder`` instead of
importing the application, so the application imports the families and none of them imports it back."""

from __future__ import annotations

from typing import Protocol

from embedfleet.services.gateway.chunking import Chunking
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

    async def embed_texts(
        self, model: str, inputs: Inputs, options: EmbedOptions, chunking: Chunking | None
    ) -> tuple[EmbedOutcome, list | None, str]:
        """``inputs`` embedded whole, or cut into chunks when ``chunking`` asks: the outcome, each input's
        chunks when the rows are the chunks' (None: a row per input), the rows' form."""
        ...

    async def run_rerank(self, call: RerankCall, request_id: str) -> tuple[str, RerankResult]:
        """``call``'s texts ranked against its query: the model that ranked them, and the ranking."""
        ...

    def stage_headers(self, outcome: EmbedOutcome) -> dict[str, str]:
        """The response headers of ``outcome``'s stage timings (milliseconds)."""
        ...


async def offers(fleet: Embedder, model: str) -> tuple[str, ...]:
    """The outputs a model's workers make, as their registrations say (none: no worker of it is seen)."""
    view = await fleet.view()
    return tuple(o for o in view.workers.get(model, {}).get("outputs", "").split(",") if o)
