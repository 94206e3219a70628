"""Embedding and reranking straight over NATS, for services inside the fleet that need no HTTP.

    import asyncio
    from embedfleet.shared.nats.fleet_client import FleetClient

    async def main() -> None:
        async with await FleetClient.connect() as fleet:  # the stack `embedfleet up` runs here
            vectors = await fleet.embed(["how do I reset my password?"])
            print(vectors.shape, vectors.dtype)  # (1, 384) float32

    asyncio.run(main())

A request goes to the tokenizer fleet and comes back from the workers as the gateway's does, without
the HTTP hop, the JSON and the gateway process: the same vectors as the HTTP routes answer, and the
same errors, raised as ``ServiceError`` (``code``: the error code the HTTP body names, ``message``,
``row``: the input at fault). Work a killed tokenizer or worker held is sent again, as for HTTP.

Connecting: with no URL and no credential, the stack ``embedfleet up`` recorded (its NATS URL and
token file) in ``data_dir``, else ``$EMBEDFLEET_DATA_DIR``, else ``./.embedfleet``, as ``reindex`` and
``jobs`` find it; else the URL and credentials given, or the environment's (``EMBEDFLEET_NATS_URL``,
``EMBEDFLEET_NATS_TOKEN_FILE``, ...). A model named None is the stack's default model (the one its
gateway uses for requests naming none) when the stack was found so, else the only model served.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Sequence

import numpy as np
from nats.aio.client import Client

from embedfleet.shared.config.registry import add_options
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.model_dir.info import same_model
from embedfleet.shared.nats.config import nats_config
from embedfleet.shared.nats.embed_client import EmbedClient
from embedfleet.shared.nats.fleet import FleetWatch
from embedfleet.shared.nats.lifecycle import NatsUnreachable, connect_within, drain_or_close
from embedfleet.shared.nats.local_stack import NoDefaultModel, default_model, use_local_stack
from embedfleet.shared.protocol import EmbedOptions, ProtocolError, RerankRequest

# what the gateway waits for pings by default (seconds): the fleet's view, and a killed process's work
_DISCOVERY_WAIT, _DISCOVERY_INTERVAL = 0.25, 2.0


class FleetClient:
    """One NATS connection, its view of the fleet, and the requests in flight on it. Use
    ``await FleetClient.connect(...)``, then ``async with`` or ``close()``."""

    def __init__(self, nc: Client, prefix: str, subjects, timeout: float, default: str | None = None) -> None:
        self._nc = nc
        self._timeout = timeout
        self._default_model = default  # the stack's, as `up` recorded it; None: the only model served
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
        deadline in seconds. Raises ``embedfleet.shared.config.option.ConfigError`` naming the URL when NATS cannot be
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
        source = use_local_stack(ns)
        cfg = nats_config(ns)
        try:
            nc = await connect_within(cfg, "embedfleet-client")
        except NatsUnreachable as exc:
            raise source.unreachable(str(exc)) from None
        default = source.stack.default_model if source.stack is not None else None
        client = cls(nc, cfg.subjects.prefix, cfg.subjects, timeout, default)
        await client._client.start()
        await client._fleet.start()
        view = await client._fleet.refresh(until_ready=True)
        if default is not None and not view.serves(default):
            await client._fleet.refresh()  # the first to answer served another model: hear every process
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
        answers them. ``model``: a served id (None: the default, see the module's notes); the options as the HTTP
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
        """The served id ``model`` names (None: the stack's default model, else the only one served)."""
        view = await self._fleet.view()
        if model is None:
            try:
                return default_model(view.models, self._default_model)
            except NoDefaultModel as exc:
                raise ServiceError(exc.code, str(exc)) from None
        for served in view.models:
            if same_model(model, served):
                return served
        if not view.models:
            raise ServiceError(ErrorCode.NO_RESPONDERS, "no tokenizer and worker are serving any model right now")
        raise ServiceError(
            ErrorCode.MODEL_NOT_FOUND, f"model {model!r} is not served here; available: {', '.join(view.models)}"
        )
