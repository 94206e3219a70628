"""The record of the local stack: written whole, read back, ignored once its `up` is gone; used only
when no NATS URL or credential is given."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from embedfleet.services.cli import build_parser
from embedfleet.shared.config import ConfigError
from embedfleet.shared.local_stack import RECORD, forget_stack, read_stack, record_stack, use_local_stack


def _ns(*args: str):
    return build_parser().parse_args(["jobs", *args])


@pytest.fixture
def no_nats_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("EMBEDFLEET_NATS") or name == "NATS_URL":
            monkeypatch.delenv(name)


def test_the_record_is_read_back_and_removed_only_by_its_writer(tmp_path):
    token = tmp_path / "nats" / "token"
    token.parent.mkdir()
    token.write_text("secret\n")
    path = record_stack(tmp_path, "nats://127.0.0.1:12345", token)
    assert json.loads(path.read_text()) == {
        "url": "nats://127.0.0.1:12345",
        "token_file": str(token),
        "pid": os.getpid(),
    }
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == [RECORD]  # no temporary file left
    assert read_stack(tmp_path).url == "nats://127.0.0.1:12345"
    forget_stack(tmp_path)
    assert not path.exists()


def test_a_record_whose_up_is_gone_is_ignored(tmp_path, no_nats_env):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / RECORD).write_text(
        json.dumps({"url": "nats://127.0.0.1:1", "token_file": None, "pid": int(gone.stdout)})
    )
    assert read_stack(tmp_path) is None
    ns = _ns("--data-dir", str(tmp_path))
    assert use_local_stack(ns).startswith("the default, as no running `embedfleet up` is recorded in")
    assert ns.nats == "nats://127.0.0.1:4222"


def test_the_record_is_used_only_when_nothing_is_given(tmp_path, no_nats_env, monkeypatch):
    token = tmp_path / "token"
    token.write_text("t\n")
    record_stack(tmp_path, "nats://127.0.0.1:23456", token)
    ns = _ns("--data-dir", str(tmp_path))
    assert "by `embedfleet up`" in use_local_stack(ns)
    assert (ns.nats, ns.nats_token_file) == ("nats://127.0.0.1:23456", str(token))
    given = _ns("--data-dir", str(tmp_path), "--nats", "nats://elsewhere:4222")
    assert use_local_stack(given) == "given by --nats or the environment" and given.nats == "nats://elsewhere:4222"
    monkeypatch.setenv("EMBEDFLEET_NATS_TOKEN", "x")  # a credential given: the record is not used
    ns = _ns("--data-dir", str(tmp_path))
    assert use_local_stack(ns) == "the default" and ns.nats == "nats://127.0.0.1:4222"
    monkeypatch.delenv("EMBEDFLEET_NATS_TOKEN")
    token.unlink()
    with pytest.raises(ConfigError, match=r"names the token file .* which is not there"):
        use_local_stack(_ns("--data-dir", str(tmp_path)))
