import argparse

import pytest

from shared.config import ConfigError, add_common_arguments, add_option, nats_config, positive_int
from shared.subjects import Subjects, model_token


def test_flag_beats_environment_beats_default(monkeypatch):
    monkeypatch.setenv("EMBEDFLEET_X", "7")
    parser = argparse.ArgumentParser()
    add_option(parser, "--x", "EMBEDFLEET_X", 3, "x", positive_int)
    assert parser.parse_args([]).x == 7
    assert parser.parse_args(["--x", "9"]).x == 9
    monkeypatch.delenv("EMBEDFLEET_X")
    parser = argparse.ArgumentParser()
    add_option(parser, "--x", "EMBEDFLEET_X", 3, "x", positive_int)
    assert parser.parse_args([]).x == 3


def test_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("EMBEDFLEET_X", "-2")
    with pytest.raises(ConfigError, match=r"\$EMBEDFLEET_X='-2'"):
        add_option(argparse.ArgumentParser(), "--x", "EMBEDFLEET_X", 3, "x", positive_int)


def test_nats_url_from_environment(monkeypatch):
    monkeypatch.delenv("EMBEDFLEET_NATS_URL", raising=False)
    monkeypatch.setenv("NATS_URL", "nats://example:4333")
    parser = argparse.ArgumentParser()
    add_common_arguments(parser)
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
