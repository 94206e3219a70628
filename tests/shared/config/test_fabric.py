import argparse

import pytest

from embedfleet.shared.config.option import ConfigError, Option, positive_int
from embedfleet.shared.config.registry import add_options
from embedfleet.shared.nats.config import nats_config
from embedfleet.shared.nats.subjects import Subjects, model_token

X = Option("--x", ("EMBEDFLEET_X",), 3, "x", frozenset({"test"}), "test", type=positive_int)


def _parser(monkeypatch_env: dict[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    X.add_to(parser, monkeypatch_env)
    return parser


def test_flag_beats_environment_beats_default():
    assert _parser({"EMBEDFLEET_X": "7"}).parse_args([]).x == 7
    assert _parser({"EMBEDFLEET_X": "7"}).parse_args(["--x", "9"]).x == 9
    assert _parser({}).parse_args([]).x == 3
    assert _parser({"EMBEDFLEET_X": ""}).parse_args([]).x == 3


def test_bad_environment_value_names_the_variable():
    with pytest.raises(ConfigError, match=r"\$EMBEDFLEET_X='-2' is not a valid value for --x"):
        _parser({"EMBEDFLEET_X": "-2"})


def test_nats_url_from_environment(monkeypatch):
    monkeypatch.delenv("EMBEDFLEET_NATS_URL", raising=False)
    monkeypatch.setenv("NATS_URL", "nats://example:4333")
    parser = argparse.ArgumentParser()
    add_options(parser, "gateway")
    ns = parser.parse_args([])
    assert nats_config(ns).url == "nats://example:4333"
    ns.nats = "example:4333"
    with pytest.raises(ConfigError, match="nats://host:port"):
        nats_config(ns)


def test_subjects():
    s = Subjects("acme.prod")
    assert s.embed("BAAI/bge-small-en-v1.5") == "acme.prod.v1.embed.BAAI_bge-small-en-v1_5"
    assert s.tokens("m") == "acme.prod.v1.tokens.m"
    assert model_token("a b.c*>") == "a_b_c__"
    with pytest.raises(ValueError, match="invalid subject prefix"):
        Subjects("bad prefix")
