"""Per-key token buckets on a clock the test moves."""

import pytest

from embedfleet.services.gateway.http.limits import KeyLimits


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_requests_per_minute_refill_continuously():
    clock = Clock()
    limits = KeyLimits(requests=2, clock=clock)
    assert limits.admit("a") is None and limits.admit("a") is None
    assert limits.admit("a") == ("requests", 30)  # one request's worth comes back every 30 s
    assert limits.admit("b") is None  # another key, its own bucket
    clock.now += 29.0
    assert limits.admit("a") == ("requests", 1)
    clock.now += 1.0
    assert limits.admit("a") is None
    clock.now += 3600.0  # an idle hour refills a minute's worth, no more
    assert [limits.admit("a") for _ in range(3)] == [None, None, ("requests", 30)]


def test_tokens_are_charged_after_the_answer_and_a_debt_waits_to_be_repaid():
    clock = Clock()
    limits = KeyLimits(tokens=60, clock=clock)
    assert limits.admit("a") is None
    limits.charge("a", 90)  # over the minute's worth: answered, the bucket in debt by 30
    assert limits.admit("a") == ("tokens", 30)
    clock.now += 30.0
    assert limits.admit("a") is None
    assert not KeyLimits().enabled and KeyLimits(tokens=1).enabled


def test_limits_need_keys():
    from embedfleet.services.cli.main import build_parser
    from embedfleet.services.gateway.config import GatewayConfig
    from embedfleet.shared.config.option import ConfigError

    ns = build_parser().parse_args(["gateway", "--nats", "nats://127.0.0.1:4222", "--key-requests-per-minute", "5"])
    with pytest.raises(ConfigError, match="give the keys"):
        GatewayConfig.from_namespace(ns)
