"""Who sees a job on a gateway: its key, the operator keys, everyone without keys (no I/O)."""

from __future__ import annotations

from embedfleet.services.cli.main import build_parser
from embedfleet.services.gateway.config import GatewayConfig
from embedfleet.services.gateway.http.limits import bind_key
from embedfleet.services.gateway.jobs.owners import JobOwners
from embedfleet.shared.jobs.requests import owner_digest
from embedfleet.shared.jobs.state import JobState


def test_a_job_is_seen_by_its_key_and_the_operators():
    owners = JobOwners(True, ("op",))
    mine, keyless = JobState("j", owner=owner_digest("a")), JobState("k")
    for key, sees in (("a", (True, False)), ("b", (False, False)), ("op", (True, True)), (None, (False, False))):
        bind_key(key)
        assert (owners.sees(mine), owners.sees(keyless)) == sees, key
    bind_key("a")
    assert owners.owner() == owner_digest("a") and owners.owner() != "a"
    open_gateway = JobOwners(False, ())
    assert open_gateway.sees(mine) and open_gateway.owner() is None and not open_gateway.private
    bind_key(None)


def test_operator_keys_are_accepted_keys(tmp_path):
    (tmp_path / "ops").write_text("# operators\nop-two\n")
    ns = build_parser().parse_args(
        [
            "gateway",
            "--nats",
            "nats://127.0.0.1:4222",
            "--api-keys",
            "k",
            "--operator-keys",
            "op-one",
            "--operator-keys-file",
            str(tmp_path / "ops"),
        ]
    )
    cfg = GatewayConfig.from_namespace(ns)
    assert cfg.api_keys == ("k", "op-one", "op-two") and cfg.operator_keys == ("op-one", "op-two")
