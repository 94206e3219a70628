import subprocess
import sys

import pytest

from embedfleet.services.cli.main import build_parser


def test_every_service_has_a_command():
    parser = build_parser()
    for command in ("up", "gateway", "tokenizer", "worker", "scorer"):
        assert parser.parse_args([command]).command == command


def test_up_defaults_and_environment(monkeypatch):
    monkeypatch.delenv("NATS_URL", raising=False)
    monkeypatch.delenv("EMBEDFLEET_NATS_URL", raising=False)
    monkeypatch.setenv("EMBEDFLEET_PORT", "9191")
    ns = build_parser().parse_args(["up"])
    assert ns.nats is None  # no URL: up starts an embedded nats-server
    assert ns.port == 9191
    assert build_parser().parse_args(["up", "--port", "7000"]).port == 7000
    monkeypatch.setenv("NATS_URL", "nats://10.0.0.1:4222")
    assert build_parser().parse_args(["worker"]).nats == "nats://10.0.0.1:4222"


def test_worker_options(monkeypatch):
    monkeypatch.setenv("EMBEDFLEET_MAX_BATCH_TOKENS", "4096")
    ns = build_parser().parse_args(["worker", "--device", "cpu", "--dtype", "float32"])
    assert (ns.device, ns.dtype, ns.max_batch_tokens) == ("cpu", "float32", 4096)


@pytest.mark.slow  # a process per case
@pytest.mark.parametrize(
    "args, fragment",
    [
        (["worker", "--max-batch-tokens", "0"], "invalid budget value"),
        (["worker", "--dtype", "float64"], "invalid choice"),
        (["tokenizer", "--model", "/nonexistent/model"], "is not a folder"),
        (["worker", "--max-batch-tokens", "100"], "below the model's sequence limit 256"),
    ],
)
def test_bad_options_exit_2_with_a_message(args, fragment):
    result = subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", *args], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr


def test_up_passes_its_gateway_options_on():
    from embedfleet.services.up.launch import _gateway_args

    args = _gateway_args(
        build_parser().parse_args(["up", "--port", "9000", "--api-keys", "a,b", "--max-in-flight", "3"])
    )
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs["--port"] == "9000" and pairs["--api-keys"] == "a,b" and pairs["--max-in-flight"] == "3"
    assert "--api-keys-file" not in pairs  # not given, not passed


def test_jobs_purge_takes_the_common_options_before_or_after_the_action(monkeypatch):
    monkeypatch.delenv("NATS_URL", raising=False)
    monkeypatch.delenv("EMBEDFLEET_NATS_URL", raising=False)
    parser = build_parser()
    listing = parser.parse_args(["jobs", "--nats", "nats://a:1"])
    assert (listing.command, listing.jobs_command, listing.nats) == ("jobs", None, "nats://a:1")
    before = parser.parse_args(["jobs", "--nats", "nats://a:1", "--subject-prefix", "p", "purge", "J"])
    assert (before.jobs_command, before.job, before.force, before.nats, before.subject_prefix) == (
        "purge",
        "J",
        False,
        "nats://a:1",
        "p",
    )  # not reset by the action's defaults
    after = parser.parse_args(["jobs", "purge", "J", "--force", "--nats", "nats://b:2"])
    assert (after.job, after.force, after.nats, after.subject_prefix) == ("J", True, "nats://b:2", "embedfleet")


def test_retention_options_reach_every_process_that_meets_the_streams(monkeypatch):
    from embedfleet.services.gateway.config import GatewayConfig
    from embedfleet.services.up.launch import _gateway_args
    from embedfleet.shared.jobs.settings import JobSettings, Retention, retention

    monkeypatch.setenv("EMBEDFLEET_JOB_TTL", "3600")
    parser = build_parser()
    for command in ("gateway", "tokenizer", "worker", "reindex", "init", "up"):
        args = [command, *(["in.jsonl", "--out", "o.npy"] if command == "reindex" else []), "--results-max-age", "60"]
        assert retention(parser.parse_args(args)) == Retention(results_max_age=60.0, job_ttl=3600.0), command
    assert (
        GatewayConfig.from_namespace(
            parser.parse_args(["gateway", "--nats", "nats://127.0.0.1:4222", "--job-history", "3"])
        ).retention.job_history
        == 3
    )
    assert JobSettings().retention == Retention()  # none given: the streams' limits are left as they are
    up = parser.parse_args(["up", "--results-max-bytes", "1000"])
    assert retention(up).environment() == {"EMBEDFLEET_RESULTS_MAX_BYTES": "1000", "EMBEDFLEET_JOB_TTL": "3600.0"}
    pairs = dict(zip(_gateway_args(up)[::2], _gateway_args(up)[1::2]))
    assert pairs["--results-max-bytes"] == "1000"
