"""Embedding and reranking straight over NATS, for services inside the fleet that need no HTTP.

    import asyncio
    from embedfleet.shared.fleet_client import FleetClient

    async def main() -> None:
        async with await FleetClient.connect() as fleet:  # the stack `embedfleet up` runs here
            vectors = await fleet.embed(["how do I reset my password?"])
            print(vectors.shape, vectors.dtype)  # (1, 384) float32

    asyncio.run(main())

A request goes to the tokenizer fleet and comes back from the workers as the gateway's does, without
the HTTP hop, the JSON and the gateway process: the same vectors as the HTTP routes answer, and the
same errors, raised as ``ServiceError`` (``code``: the error code the HTTP body names, ``message``,
``row``: the input at fault). Work a killed tokenizer or worker held is sent again, as for HTTP.

Connecting: with no URL and no credential, the stack ``embedfleet up`` recorded in ``data_dir``
(its NATS URL and token file), as ``reindex`` and ``jobs`` find it; else the URL and credentials
given, or the environment's (``EMBEDFLEET_NATS_URL``, ``EMBEDFLEET_NATS_TOKEN_FILE``, ...).
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Sequence

import numpy as np
from nats.aio.client import Client

from embedfleet.shared.client import EmbedClient
from embedfleet.shared.config import nats_config
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.fleet import FleetWatch
from embedfleet.shared.lifecycle import connect_within, drain_or_close
from embedfleet.shared.local_stack import use_local_stack
from embedfleet.shared.model_dir.info import same_model
from embedfleet.shared.options import add_options
from embedfleet.shared.protocol import EmbedOptions, ProtocolError, RerankRequest

# what the gateway waits for pings by default (seconds): the fleet's view, and a killed process's work
_DISCOVERY_WAIT, _DISCOVERY_INTERVAL = 0.25, 2.0


class FleetClient:
    """One NATS connection, its view of the fleet, and the requests in flight on it. Use
    ``await FleetClient.connect(...)``, then ``async with`` or ``close()``."""

    def __init__(self, nc: Client, prefix: str, subjects, timeout: float) -> None:
        self._nc = nc
        self._timeout = timeout
        self._fleet = FleetWatch(
            nc, prefix, _DISCOVERY_WAIT, _DISCOVERY_INTERVAL, busy=lambda: self._client.in_flight > 0
        )
        self._client = EmbedClient(nc, subjects, fleet=self._fleet)
        self._fleet.on_lost(self._client.resend_missing)

    @classmethod
    async def connect(
        cls,
        nats: str | None = None,
        *,
        token_file: str | None = None,
        data_dir: str | None = None,
        subject_prefix: str | None = None,
        timeout: float = 30.0,
    ) -> FleetClient:
        """Connect (see the module's notes) and look at the fleet once; ``timeout``: each request's
        deadline in seconds. Raises ``embedfleet.shared.option.ConfigError`` naming the URL when NATS cannot be
        reached within 5 seconds."""
        parser = argparse.ArgumentParser(add_help=False)
        add_options(parser, "jobs")  # the one-shot commands' NATS options, with their environment defaults
        ns = parser.parse_args([])
        for dest, value in (
            ("nats", nats),
            ("nats_token_file", token_file),
            ("data_dir", data_dir),
            ("subject_prefix", subject_prefix),
        ):
            if value is not None:
                setattr(ns, dest, value)
        use_local_stack(ns)
        cfg = nats_config(ns)
        nc = await connect_within(cfg, "embedfleet-client")
        client = cls(nc, cfg.subjects.prefix, cfg.subjects, timeout)
        await client._client.start()
        await client._fleet.start()
        await client._fleet.refresh(until_ready=True)
        return client

    async def __aenter__(self) -> FleetClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._fleet.stop()
        await self._client.stop()
        await drain_or_close(self._nc)

    async def models(self) -> list[str]:
        """The models a tokenizer and a worker serve right now."""
        return (await self._fleet.view()).models

    async def embed(
        self,
        texts: str | Sequence[str],
        model: str | None = None,
        *,
        normalize: bool | None = None,
        dimensions: int | None = None,
        prompt_name: str | None = None,
        input_type: str | None = None,
        truncate: bool = True,
    ) -> np.ndarray:
        """[len(texts), dim] float32 vectors of ``texts`` (one string: one row), as POST /v1/embeddings
        answers them. ``model``: a served id (None: the only one served); the options as the HTTP
        routes take them (``normalize`` None: as the model's folder says)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts or not all(isinstance(t, str) and t for t in texts):
            raise ServiceError(ErrorCode.INVALID_REQUEST, "texts must be one or more non-empty strings")
        try:
            options = EmbedOptions(
                normalize=normalize,
                dimensions=dimensions,
                prompt_name=prompt_name,
                input_type=input_type,
                truncate=truncate,
            )
        except ProtocolError as exc:
            raise ServiceError(ErrorCode.INVALID_REQUEST, str(exc).removeprefix("options.")) from None
        served = await self._model(model)
        outcome = await self._client.embed(served, texts, options, self._timeout)
        return outcome.vectors

    async def rerank(
        self, query: str, documents: Sequence[str], model: str | None = None, *, top_n: int | None = None
    ) -> list[tuple[int, float]]:
        """``(index into documents, score)`` best first, as POST /rerank ranks them (``top_n``: the best n)."""
        if (
            not isinstance(query, str)
            or not query
            or not documents
            or not all(isinstance(d, str) and d for d in documents)
        ):
            raise ServiceError(ErrorCode.INVALID_REQUEST, "query and documents must be non-empty strings")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
            raise ServiceError(ErrorCode.INVALID_REQUEST, "top_n must be a positive integer")
        served = await self._model(model)
        request = RerankRequest(uuid.uuid4().hex, served, query, list(documents), time.time() + self._timeout, top_n)
        result = await self._client.rerank(request, self._timeout)
        return [(int(i), float(s)) for i, s in zip(result.indices, result.scores)]

    async def _model(self, model: str | None) -> str:
        """The served id ``model`` names (None: the only model served)."""
        view = await self._fleet.view()
        if model is None and len(view.models) == 1:
            return view.models[0]
        if model is not None:
            for served in view.models:
                if same_model(model, served):
                    return served
        if not view.models:
            raise ServiceError(ErrorCode.NO_RESPONDERS, "no tokenizer and worker are serving any model right now")
        if model is None:
            raise ServiceError(
                ErrorCode.INVALID_REQUEST, f"several models are served ({', '.join(view.models)}): name one"
            )
        raise ServiceError(
            ErrorCode.MODEL_NOT_FOUND, f"model {model!r} is not served here; available: {', '.join(view.models)}"
        )
