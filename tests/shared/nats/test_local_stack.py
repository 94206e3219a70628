"""The record of the local stack: written whole, read back, ignored once its `up` is gone; used only
when no NATS URL or credential is given."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from embedfleet.services.cli.main import build_parser
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.nats.local_stack import (
    RECORD,
    LocalStack,
    NoDefaultModel,
    default_model,
    forget_stack,
    read_stack,
    record_stack,
    stack_folders,
    use_local_stack,
)


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
    path = record_stack(tmp_path, "nats://127.0.0.1:12345", token, "mini")
    assert json.loads(path.read_text()) == {
        "url": "nats://127.0.0.1:12345",
        "token_file": str(token),
        "pid": os.getpid(),
        "default_model": "mini",
    }
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == [RECORD]  # no temporary file left
    assert read_stack(tmp_path) == LocalStack("nats://127.0.0.1:12345", str(token), os.getpid(), "mini")
    forget_stack(tmp_path)
    assert not path.exists()


def test_a_record_whose_up_is_gone_is_ignored(tmp_path, no_nats_env):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / RECORD).write_text(
        json.dumps({"url": "nats://127.0.0.1:1", "token_file": None, "pid": int(gone.stdout)})
    )
    assert read_stack(tmp_path) is None
    ns = _ns("--data-dir", str(tmp_path))
    source = use_local_stack(ns, {})
    assert source.said == f"the default, as no running `embedfleet up` is recorded in {tmp_path / RECORD}"
    assert source.fallback and source.stack is None and ns.nats == "nats://127.0.0.1:4222"


def test_the_record_is_used_only_when_nothing_is_given(tmp_path, no_nats_env, monkeypatch):
    token = tmp_path / "token"
    token.write_text("t\n")
    record_stack(tmp_path, "nats://127.0.0.1:23456", token)
    ns = _ns("--data-dir", str(tmp_path))
    assert "by `embedfleet up`" in use_local_stack(ns).said
    assert (ns.nats, ns.nats_token_file) == ("nats://127.0.0.1:23456", str(token))
    given = _ns("--data-dir", str(tmp_path), "--nats", "nats://elsewhere:4222")
    source = use_local_stack(given)
    assert source.said == "given by --nats or the environment" and given.nats == "nats://elsewhere:4222"
    assert not source.fallback  # a URL given is tried until it answers
    monkeypatch.setenv("EMBEDFLEET_NATS_TOKEN", "x")  # a credential given: the record is not used
    ns = _ns("--data-dir", str(tmp_path))
    source = use_local_stack(ns)
    assert source.said == "the default" and ns.nats == "nats://127.0.0.1:4222" and not source.fallback
    monkeypatch.delenv("EMBEDFLEET_NATS_TOKEN")
    token.unlink()
    with pytest.raises(ConfigError, match=r"names the token file .* which is not there"):
        use_local_stack(_ns("--data-dir", str(tmp_path)))


def test_a_record_without_a_default_model_reads_as_none(tmp_path):
    """A record an older `up` wrote (no default_model) is still the stack's."""
    (tmp_path / RECORD).write_text(json.dumps({"url": "nats://127.0.0.1:1", "token_file": None, "pid": os.getpid()}))
    assert read_stack(tmp_path) == LocalStack("nats://127.0.0.1:1", None, os.getpid(), None)


def test_the_stack_is_looked_for_in_the_variables_folder_then_the_default(tmp_path, no_nats_env, monkeypatch):
    """$EMBEDFLEET_DATA_DIR, then ./.embedfleet: the first with a running `up` wins, and the default URL's
    reason names every record looked for; a --data-dir flag names the one folder looked in."""
    flag, variable, here = tmp_path / "flag", tmp_path / "variable", tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    environ = {"EMBEDFLEET_DATA_DIR": str(variable)}
    monkeypatch.setenv("EMBEDFLEET_DATA_DIR", str(variable))
    assert stack_folders(_ns("--data-dir", str(flag)), environ) == [flag]  # the flag: that folder alone
    assert stack_folders(_ns(), environ) == [variable, here / ".embedfleet"]  # the flag's value is the variable's
    ns = _ns()
    source = use_local_stack(ns, environ)
    records = [variable / RECORD, here / ".embedfleet" / RECORD]
    assert source.said == f"the default, as no running `embedfleet up` is recorded in {records[0]} or {records[1]}"
    assert str(source.unreachable("cannot reach")) == (
        f"no NATS server at nats://127.0.0.1:4222 (the default; no running `embedfleet up` recorded in "
        f"{records[0]} or {records[1]}): start `embedfleet up`, or give --nats URL"
    )
    for n, folder in enumerate((here / ".embedfleet", variable)):  # each found before those after it
        record_stack(folder, f"nats://127.0.0.1:{4000 + n}", None)
        ns = _ns()
        source = use_local_stack(ns, environ)
        assert ns.nats == f"nats://127.0.0.1:{4000 + n}" and source.said.startswith(f"recorded in {folder / RECORD}")
        assert not source.fallback and source.stack is not None
    ns = _ns("--data-dir", str(flag))  # a folder named, where no `up` runs: not another folder's stack
    source = use_local_stack(ns, environ)
    assert ns.nats == "nats://127.0.0.1:4222" and source.looked == (flag,)


def test_the_default_model_is_the_recorded_one_else_the_only_one_served():
    assert default_model(["mini", "rr"], "mini") == "mini"
    assert default_model(["all-MiniLM-L6-v2"], "sentence-transformers/all-MiniLM-L6-v2") == "all-MiniLM-L6-v2"
    assert default_model(["mini"], None) == "mini"
    for served, recorded, code, message in (
        (["mini", "rr"], None, ErrorCode.INVALID_REQUEST, "several models are served (mini, rr)"),
        ([], None, ErrorCode.NO_RESPONDERS, "no tokenizer and worker are serving any model"),
        (
            ["rr"],
            "mini",
            ErrorCode.NO_RESPONDERS,
            "the stack's default model 'mini' is not served right now; served: rr",
        ),
    ):
        with pytest.raises(NoDefaultModel, match=re.escape(message)) as exc:
            default_model(served, recorded)
        assert exc.value.code == code
