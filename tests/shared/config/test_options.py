"""shared/config/sections/ and registry.py: every option declared once, and the parsers, the child arguments and the
option table of docs/options.md all made from the declarations."""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import MISSING
from pathlib import Path

import pytest

from embedfleet.services.cli.main import build_parser
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.registry import (
    COMMANDS,
    OPTIONS,
    add_options,
    arguments,
    declared,
    default,
    env_names,
    markdown_table,
    option,
)

ROOT = Path(__file__).resolve().parents[3]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found = {}
    for action in parser._actions:  # argparse gives no public view of its sub-commands
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = sub
                found.update({f"{name} {n}": s for n, s in _subparsers(sub).items()})
    return found


def test_no_command_takes_a_flag_dest_or_variable_twice():
    for command in COMMANDS:
        options = declared(command)
        for what in ("flag", "dest"):
            counts = Counter(getattr(o, what) for o in options)
            assert not [k for k, n in counts.items() if n > 1], (command, what)
        names = Counter(name for o in options for name in o.env)
        assert not [k for k, n in names.items() if n > 1], command


def test_every_declaration_has_a_command_and_a_known_group():
    for o in OPTIONS:
        assert o.commands and o.commands <= set(COMMANDS), o.flag
        assert o.help and not o.help.endswith(".")
        assert o.env_only == (not o.flag.startswith("--")), o.flag
        assert all(re.fullmatch(r"(EMBEDFLEET_[A-Z0-9_]+|NATS_URL)", n) for n in o.env), o.flag


def test_each_commands_parser_is_made_from_its_declarations(monkeypatch):
    for o in OPTIONS:
        for name in o.env:
            monkeypatch.delenv(name, raising=False)
    subs = _subparsers(build_parser())
    assert set(subs) == set(COMMANDS)
    for command, sub in subs.items():
        flags = {s for a in sub._actions for s in a.option_strings if s not in ("-h", "--help")}
        again = declared("jobs") if command.startswith("jobs ") else []  # the options of jobs, after the action
        assert flags == {o.flag for o in [*declared(command), *again] if not o.env_only}, command
        if again:
            continue
        ns = sub.parse_args({"reindex": ["in.jsonl", "--out", "o.npy"], "check": ["m"], "auth": ["f"]}.get(command, []))
        for o in declared(command):
            if not o.env_only and o.dest != "out":
                assert getattr(ns, o.dest) == o.value({}), (command, o.flag)


def test_flag_beats_environment_beats_default(monkeypatch):
    monkeypatch.delenv("EMBEDFLEET_MAX_IN_FLIGHT", raising=False)
    assert build_parser().parse_args(["gateway"]).max_in_flight == default("max_in_flight") == 512
    monkeypatch.setenv("EMBEDFLEET_MAX_IN_FLIGHT", "7")
    assert build_parser().parse_args(["gateway"]).max_in_flight == 7
    assert build_parser().parse_args(["gateway", "--max-in-flight", "9"]).max_in_flight == 9
    monkeypatch.setenv("EMBEDFLEET_MAX_IN_FLIGHT", "")  # empty: unset
    assert build_parser().parse_args(["gateway"]).max_in_flight == 512


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("EMBEDFLEET_PORT", "x", "$EMBEDFLEET_PORT='x' is not a valid value for --port"),
        ("EMBEDFLEET_MAX_INPUTS", "-2", "$EMBEDFLEET_MAX_INPUTS='-2' is not a valid value for --max-inputs"),
        ("EMBEDFLEET_LOG_LEVEL", "loud", "$EMBEDFLEET_LOG_LEVEL='loud': choose one of debug, info, warning, error"),
    ],
)
def test_a_bad_variable_names_itself_and_the_option(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as exc:
        build_parser()
    assert str(exc.value) == message


def test_nats_url_reads_a_second_variable_and_up_defaults_to_none(monkeypatch):
    monkeypatch.delenv("EMBEDFLEET_NATS_URL", raising=False)
    monkeypatch.delenv("NATS_URL", raising=False)
    # none: the services and one-shot commands look for a stack `up` recorded, `up` starts a nats-server
    assert build_parser().parse_args(["gateway"]).nats is None
    assert build_parser().parse_args(["up"]).nats is None
    monkeypatch.setenv("NATS_URL", "nats://b:2")
    assert build_parser().parse_args(["up"]).nats == "nats://b:2"
    monkeypatch.setenv("EMBEDFLEET_NATS_URL", "nats://a:1")  # the first variable wins
    assert build_parser().parse_args(["gateway"]).nats == "nats://a:1"


def test_secrets_have_no_flag_but_are_read_by_every_connected_command():
    secrets = [o for o in OPTIONS if o.secret]
    assert {o.env for o in secrets} == {
        ("EMBEDFLEET_NATS_PASSWORD",),
        ("EMBEDFLEET_NATS_TOKEN",),
        ("EMBEDFLEET_KEY_ID_SECRET",),  # the gateway's: the HMAC key of API keys' ids in metrics
    }
    parser = argparse.ArgumentParser()
    add_options(parser, "worker")
    assert not [a for a in parser._actions if "password" in a.dest and "file" not in a.dest]
    for command in ("up", "gateway", "tokenizer", "worker", "scorer", "reindex", "init", "jobs"):
        assert {"EMBEDFLEET_NATS_PASSWORD", "EMBEDFLEET_NATS_TOKEN", "NATS_URL"} <= env_names(command)


def test_up_models_come_from_flags_else_from_the_variable(monkeypatch):
    monkeypatch.setenv("EMBEDFLEET_MODEL", "a=/m/a, /m/b")
    assert build_parser().parse_args(["up"]).model == ["a=/m/a", "/m/b"]
    assert build_parser().parse_args(["up", "--model", "/m/c", "--model", "/m/d"]).model == ["/m/c", "/m/d"]


def test_a_childs_arguments_give_it_the_same_namespace(monkeypatch):
    for o in OPTIONS:
        for name in o.env:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EMBEDFLEET_NATS_URL", "nats://user:secret@a:1")  # stays in the environment
    monkeypatch.setenv("EMBEDFLEET_MAX_QUEUED_TOKENS", "1000")
    given = [
        "worker",
        "--device",
        "cpu",
        "--max-batch-tokens",
        "4096",
        "--graphs",
        "off",
        "--ack-wait",
        "2.5",
        "--results-max-age",
        "60",
        "--log-format",
        "json",
        "--model",
        "/m",
        "--load-interval",
        "0.01",
    ]
    ns = build_parser().parse_args(given)
    args = arguments(ns, "worker")
    assert "nats://user:secret@a:1" not in args and "--max-queued-tokens" not in args
    assert build_parser().parse_args(["worker", *args]) == ns
    replica = build_parser().parse_args(["worker", *arguments(ns, "worker", replicas=1, threads=3)])
    assert (replica.replicas, replica.threads, replica.device) == (1, 3, "cpu")
    # a child started with another environment is given what that one lacks
    assert "--max-queued-tokens" in arguments(ns, "worker", environ={})


def test_up_passes_the_gateway_and_scorer_their_fleet_options(monkeypatch):
    from embedfleet.services.up.launch import _gateway_args

    monkeypatch.delenv("EMBEDFLEET_DISCOVERY_INTERVAL", raising=False)
    ns = build_parser().parse_args(["up", "--discovery-interval", "0.2", "--port", "9000"])
    gateway = build_parser().parse_args(["gateway", *_gateway_args(ns)])
    assert (gateway.discovery_interval, gateway.port) == (0.2, 9000)
    scorer = build_parser().parse_args(["scorer", *arguments(ns, "scorer", ["fleet"])])
    assert scorer.discovery_interval == 0.2


def test_the_docs_table_is_the_declarations():
    page = (ROOT / "docs" / "options.md").read_text()
    block = page.split("<!-- options:begin -->\n", 1)[1].split("<!-- options:end -->", 1)[0]
    assert block == markdown_table(), (
        "docs/options.md's option table differs from shared/config/sections/: paste markdown_table()"
    )
    assert markdown_table().count("\n") == len(OPTIONS) + 2


def _table_commands(cell: str, subs: dict) -> set[str]:
    """A table row's commands: a list, or "all" (every command, the jobs actions too) "but" some."""
    if not cell.startswith("all"):
        named = set(cell.split(", "))
        return named | ({c for c in subs if c.startswith("jobs ")} if "jobs" in named else set())
    return set(subs) - set(cell.removeprefix("all").removeprefix(" but ").split(" and ")) - {""}


def test_the_tables_commands_are_those_that_take_the_flag():
    """Read as a user reads it: "all" is every command but those named after it (check and auth take
    no --log-level or --ready-file); a row per declaration, so a flag's rows together name its commands."""
    subs = _subparsers(build_parser())
    named: dict[str, set[str]] = {}
    for o, row in zip(OPTIONS, markdown_table().splitlines()[2:]):
        if not o.env_only:
            named.setdefault(o.flag, set()).update(_table_commands(row.split(" | ")[3], subs))
    for flag, commands in named.items():
        assert commands == {c for c, sub in subs.items() if flag in sub._option_string_actions}, flag
    assert _table_commands("all but auth and check", subs) == set(subs) - {"auth", "check"}


def _configs():
    from embedfleet.services.gateway.config import GatewayConfig, HttpLimits
    from embedfleet.services.gpu_worker.config import WorkerConfig
    from embedfleet.services.scorer.config import ScorerConfig
    from embedfleet.services.tokenizer.config import TokenizerConfig
    from embedfleet.shared.jobs.settings import JobSettings, Retention
    from embedfleet.shared.observability.metrics_server import MetricsEndpoint

    return (
        (GatewayConfig, "gateway"),
        (HttpLimits, "gateway"),
        (WorkerConfig, "worker"),
        (ScorerConfig, "scorer"),
        (TokenizerConfig, "tokenizer"),
        (MetricsEndpoint, "worker"),
        (JobSettings, "worker"),
        (Retention, "worker"),
    )


def test_config_defaults_are_the_declared_ones():
    from dataclasses import fields

    from embedfleet.shared.config.registry import settings_of

    checked = 0
    for cls, command in _configs():
        held = settings_of(cls)
        for f in fields(cls):
            if f.name in held:
                dest, convert = held[f.name]
                value = option(dest, command).value({})
                made = f.default if f.default_factory is MISSING else f.default_factory()
                assert made == (convert(value) if convert else value), (cls.__name__, f.name)
                checked += 1
    assert checked >= 40


def test_every_service_option_is_held_by_a_config_field_or_read_where_named():
    """A service's options reach its config through ``setting`` fields (one declaration, one field);
    the few read another way are named here, with where."""
    from embedfleet.shared.config.registry import settings_of

    elsewhere = {  # dest -> what reads it
        "model": "load_model_info",
        "model_name": "load_model_info",
        "api_keys_file": "gateway api_keys()",
        "operator_keys_file": "gateway operator_keys()",
        "key_tables_file": "gateway key_tables()",
        "otlp_endpoint": "TracingConfig",
        "trace_sample_ratio": "TracingConfig",
        "log_level": "cli",
        "log_format": "cli",
        "ready_file": "lifecycle",
        "subject_prefix": "nats_config",
        "data_dir": "use_local_stack (where a stack `up` recorded is looked for)",
    }
    held = {dest for cls, _ in _configs() for dest, _ in settings_of(cls).values()}
    for command in ("gateway", "tokenizer", "worker", "scorer"):
        for o in declared(command):
            if o.group in ("nats",) or o.env_only:
                continue  # embedfleet.shared.nats.config.nats_config reads these, and the environment's own settings
            assert o.dest in held or o.dest in elsewhere, f"{command} {o.flag}: held by no config field"


def test_a_config_is_made_of_the_parsed_options():
    from embedfleet.services.cli.main import build_parser
    from embedfleet.services.gateway.config import GatewayConfig

    ns = build_parser().parse_args(
        [
            "gateway",
            "--nats",
            "nats://127.0.0.1:4222",  # a config is made once the command has its URL (given, recorded or the default)
            "--port",
            "9999",
            "--open-paths",
            "/a, /b",
            "--retries",
            "7",
            "--max-header-bytes",
            "4096",
            "--results-max-age",
            "3600",
        ]
    )
    cfg = GatewayConfig.from_namespace(ns)
    assert (cfg.port, cfg.open_paths, cfg.retries) == (9999, ("/a", "/b"), 7)
    assert cfg.http.max_header_bytes == 4096 and cfg.retention.results_max_age == 3600


def test_help_never_prints_credentials_or_keys_from_the_environment(monkeypatch, capsys):
    from embedfleet.services.cli.main import build_parser

    monkeypatch.setenv("EMBEDFLEET_NATS_URL", "nats://alice:s3cret@h:4222")
    monkeypatch.setenv("EMBEDFLEET_API_KEYS", "k-secret")
    for command in ("gateway", "up", "tokenizer"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        shown = capsys.readouterr().out
        assert "--nats" in shown and "s3cret" not in shown and "k-secret" not in shown


def test_a_lookup_names_what_is_missing_or_ambiguous():
    from embedfleet.shared.config.registry import option

    with pytest.raises(LookupError, match="no option 'nope' is declared"):
        option("nope")
    with pytest.raises(LookupError, match="no option 'port' for 'worker' is declared"):
        option("port", "worker")
    with pytest.raises(LookupError, match=r"'threads' is declared 2 ways \(commands .*\): name the command"):
        option("threads")
    assert option("threads", "worker").env != option("threads", "tokenizer").env  # named, each is found
