"""What an API family's routes ask of the fleet behind the gateway: what it serves now and the model a
request names (``Fleet``); texts embedded, tokenized and decoded, pairs reranked, a classifier's logits
(``Embedder``); and what a model's workers offer. ``Gateway`` (app.py) is the one implementation; a family's
work (``<family>/serving.py``) types against these instead of importing the application (the bulk jobs'
routes against jobs/serving.py's ``JobsHost``, a ``Fleet`` too), so the application imports the families
and none of them imports it back."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from embedfleet.services.gateway.chunking import Chunking
from embedfleet.services.gateway.inputs import Inputs
from embedfleet.services.gateway.rerank.api import RerankCall
from embedfleet.shared.nats.embed_client import EmbedOutcome
from embedfleet.shared.nats.fleet import FleetView
from embedfleet.shared.protocol import EmbedOptions, RerankResult, Spans, TokenizeResult


class Fleet(Protocol):
    """The fleet as the gateway sees it: the models, tokenizers and workers it serves, and a request's model."""

    async def view(self) -> FleetView:
        """The models, tokenizers and workers the gateway sees now."""
        ...

    async def resolve_model(self, requested: str | None) -> str:
        """The served id ``requested`` names (None: the default model); ApiError when none is served."""
        ...


class Embedder(Fleet, Protocol):
    """Embedding, reranking and tokenizing through the fleet, each call admitted, its errors the API's;
    an embedding's tokens accounted (in the metrics, charged to the request's API key)."""

    @property
    def request_timeout(self) -> float:
        """Seconds a request's work through the fleet may take (--request-timeout)."""
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

    async def classify(
        self, model: str, texts: list[str], pairs: list[tuple[str, str]] | None, options: EmbedOptions, rows: list[int]
    ) -> EmbedOutcome:
        """A sequence classifier's logits (its "vectors") of ``texts``, or of ``pairs`` when given: the
        request's inputs ``rows`` (an input's error names its row), not yet accounted (``account``)."""
        ...

    def account(self, model: str, outcome: EmbedOutcome) -> None:
        """``outcome``'s tokens in the metrics, by model and by API key, and charged to the request's key."""
        ...

    async def run_tokenize(
        self, model: str, texts: list[str], add_special_tokens: bool, prompt_name: str | None
    ) -> TokenizeResult:
        """How ``texts`` tokenize by ``model``'s tokenizer."""
        ...

    async def run_decode(self, model: str, ids: list[np.ndarray], skip_special_tokens: bool) -> list[str]:
        """The text of each sequence of token IDs, by ``model``'s tokenizer."""
        ...

    async def run_rerank(self, call: RerankCall, request_id: str) -> tuple[str, RerankResult]:
        """``call``'s texts ranked against its query: the model that ranked them, and the ranking."""
        ...

    def stage_headers(self, outcome: EmbedOutcome) -> dict[str, str]:
        """The response headers of ``outcome``'s stage timings (milliseconds)."""
        ...


async def offers(fleet: Fleet, model: str) -> tuple[str, ...]:
    """The outputs a model's workers make, as their registrations say (none: no worker of it is seen)."""
    view = await fleet.view()
    return tuple(o for o in view.workers.get(model, {}).get("outputs", "").split(",") if o)
