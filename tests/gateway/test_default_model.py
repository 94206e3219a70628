"""Which model a request that names none gets: --default-model, else the first served by id."""

from __future__ import annotations

import asyncio

import pytest

from embedfleet.services.cli.main import build_parser
from embedfleet.services.gateway.app import Gateway
from embedfleet.services.gateway.config import GatewayConfig
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.metrics import Metrics
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.nats.config import NatsConfig
from embedfleet.shared.nats.fleet import FleetView
from embedfleet.shared.nats.subjects import Subjects


class _Fleet:
    """Discovery that always sees ``models`` (each with a tokenizer and a worker)."""

    def __init__(self, models: list[str]) -> None:
        meta = {m: {"model": m} for m in models}
        self._view = FleetView(meta, meta, 0.0)

    async def view(self) -> FleetView:
        return self._view

    async def refresh(self) -> FleetView:
        return self._view


def _gateway(models: list[str], default: str | None) -> Gateway:
    cfg = GatewayConfig(
        NatsConfig("nats://127.0.0.1:4222", Subjects()), "127.0.0.1", 8080, 30.0, 16, 1 << 20, default_model=default
    )
    gw = Gateway(cfg, Metrics())
    gw.discovery = _Fleet(models)
    return gw


@pytest.mark.parametrize(
    "default, want",
    [(None, "a-embed"), ("z-embed", "z-embed"), ("org/z-embed", "z-embed"), ("m-rerank", "m-rerank")],
)
def test_requests_naming_no_model(default, want):
    gw = _gateway(["z-embed", "a-embed", "m-rerank"], default)
    assert asyncio.run(gw.resolve_model(None)) == want
    assert asyncio.run(gw.resolve_model("a-embed")) == "a-embed"  # a named model is never the default's business


def test_a_default_not_served_is_unavailable_not_unknown():
    gw = _gateway(["a-embed"], "gone")
    with pytest.raises(ApiError) as err:
        asyncio.run(gw.resolve_model(None))
    assert err.value.code == ErrorCode.NO_RESPONDERS
    assert "'gone'" in err.value.message and "a-embed" in err.value.message


def test_option_and_environment(monkeypatch):
    monkeypatch.setenv("EMBEDFLEET_DEFAULT_MODEL", "from-env")
    assert build_parser().parse_args(["gateway"]).default_model == "from-env"
    assert build_parser().parse_args(["gateway", "--default-model", "flag"]).default_model == "flag"
    with pytest.raises(ConfigError, match="--default-model must name a model"):
        GatewayConfig(NatsConfig("nats://127.0.0.1:4222", Subjects()), "h", 1, 1.0, 1, 1, default_model=" ")
