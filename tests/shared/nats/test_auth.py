"""NATS credential and TLS options: parsing, checks with errors that name the option, what reaches
nats-py, what `embedfleet up` hands its services, and that secrets stay out of URLs, reprs and logs."""

from __future__ import annotations

import argparse
import logging
import ssl
import subprocess
import sys

import nats.errors
import nkeys
import pytest

from embedfleet.services.cli.main import build_parser
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.sections.nats import PASSWORD_ENV, TOKEN_ENV
from embedfleet.shared.nats.auth import NatsAuth, redact, split_credentials
from embedfleet.shared.nats.config import NATS_SECURITY_ENV, NatsConfig, child_environment, nats_config, nats_security
from embedfleet.shared.nats.lifecycle import RepeatFilter, describe_error
from embedfleet.shared.nats.local_stack import use_local_stack
from embedfleet.shared.nats.subjects import Subjects
from tests.support.nats_secrets import CertificateAuthority, Operator, new_seed, public_key

SECRET = "pa55:w@rd/x"  # characters a URL must escape


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for name in (*NATS_SECURITY_ENV.values(), PASSWORD_ENV, TOKEN_ENV, "EMBEDFLEET_NATS_URL", "NATS_URL"):
        monkeypatch.delenv(name, raising=False)


def parse(*args: str, command: str = "tokenizer") -> argparse.Namespace:
    return build_parser().parse_args([command, *args])


def config(*args: str) -> NatsConfig:
    """The NATS config a service builds from ``args``, as the command line does (services/cli/main.py): the
    URL first (credentials given without one: the default server), then the rest."""
    ns = parse(*args)
    use_local_stack(ns)
    return nats_config(ns)


def write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_split_credentials():
    assert split_credentials("nats://a:4222") == ("nats://a:4222", None, None)
    assert split_credentials("nats://svc:pa55%3Aw%40rd%2Fx@a:4222") == ("nats://a:4222", "svc", SECRET)
    assert split_credentials("nats://s3cret@a:4222") == ("nats://a:4222", "s3cret", None)  # a token
    assert split_credentials("nats://u:p@a:1,nats://b:2,tls://u:p@c:3") == ("nats://a:1,nats://b:2,tls://c:3", "u", "p")
    with pytest.raises(ValueError, match="different credentials") as err:
        split_credentials("nats://u:p@a:1,nats://u:q@b:2")
    assert ":p@" not in str(err.value) and ":q@" not in str(err.value)


def test_redact():
    assert redact("nats://u:p@a:1,nats://b:2, tls://t@c:3") == "nats://***@a:1,nats://b:2, tls://***@c:3"
    assert redact("u:p@a:1") == "***@a:1" and redact("nats://a:1") == "nats://a:1"
    with pytest.raises(ConfigError, match=r"NATS URL '\*\*\*@a:4222' must look like nats://host:port"):
        config("--nats", "u:p@a:4222")


def test_credentials_in_the_url_leave_it_and_stay_out_of_repr():
    cfg = config("--nats", "nats://svc:pa55%3Aw%40rd%2Fx@10.0.0.1:4222")
    assert cfg.url == "nats://10.0.0.1:4222"
    assert (cfg.auth.user, cfg.auth.password) == ("svc", SECRET)
    assert cfg.auth.connect_options() == {"user": "svc", "password": SECRET}
    assert SECRET not in repr(cfg) and "pa55" not in repr(cfg)
    token = config("--nats", "nats://t0ken@10.0.0.1:4222")
    assert (token.url, token.auth.token, token.auth.connect_options()) == (
        "nats://10.0.0.1:4222",
        "t0ken",
        {"token": "t0ken"},
    )
    with pytest.raises(ConfigError, match="must not carry credentials"):
        NatsConfig("nats://u:p@a:4222", Subjects("embedfleet"))


def test_user_and_password_from_a_file_or_the_environment(tmp_path, monkeypatch):
    password_file = write(tmp_path / "password", SECRET + "\n")
    cfg = config("--nats-user", "svc", "--nats-password-file", password_file)
    assert cfg.auth.connect_options() == {"user": "svc", "password": SECRET}
    assert cfg.auth.method == "user 'svc' and a password"
    monkeypatch.setenv(PASSWORD_ENV, "from-env")
    assert config("--nats-user", "svc").auth.password == "from-env"
    with pytest.raises(ConfigError, match=rf"given twice: --nats-password-file and \${PASSWORD_ENV}"):
        config("--nats-user", "svc", "--nats-password-file", password_file)


def test_token_from_a_file_or_the_environment(tmp_path, monkeypatch):
    cfg = config("--nats-token-file", write(tmp_path / "token", "t0ken\n"))
    assert cfg.auth.connect_options() == {"token": "t0ken"} and cfg.auth.method == "a token"
    monkeypatch.setenv(TOKEN_ENV, "env-t0ken")
    assert config().auth.connect_options() == {"token": "env-t0ken"}


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--nats-user", "svc"], {}, "--nats-user 'svc' needs a password"),
        ([], {PASSWORD_ENV: "x"}, "a NATS password needs a user: --nats-user"),
        (["--nats-user", "svc"], {PASSWORD_ENV: "x", TOKEN_ENV: "t"}, r"given 2 ways \(user and password, token\)"),
        (["--nats", "nats://u:p@a:4222", "--nats-user", "v"], {}, "both in the --nats URL and as options"),
        (["--nats", "nats://t@a:4222"], {TOKEN_ENV: "t2"}, "both in the --nats URL and as options"),
        (
            ["--nats-password-file", "/nonexistent/password"],
            {},
            "--nats-password-file /nonexistent/password: cannot read it",
        ),
        (["--nats-token-file", "/nonexistent/token"], {}, "--nats-token-file /nonexistent/token: cannot read it"),
        (["--nats-nkey-seed", "/nonexistent/seed"], {}, "--nats-nkey-seed /nonexistent/seed: cannot read it"),
        (["--nats-creds", "/nonexistent/x.creds"], {}, "--nats-creds /nonexistent/x.creds: cannot read it"),
        (["--nats-tls-cert", "/x.pem"], {}, "--nats-tls-cert needs --nats-tls-key"),
        (["--nats-tls-key", "/x.pem"], {}, "--nats-tls-key needs --nats-tls-cert"),
        (["--nats-tls-ca", "/nonexistent/ca.pem"], {}, "--nats-tls-ca /nonexistent/ca.pem: cannot load it"),
    ],
)
def test_bad_options_name_the_option(args, env, message, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        config(*args)


def test_files_that_hold_the_wrong_thing(tmp_path):
    empty = write(tmp_path / "empty", "")
    with pytest.raises(ConfigError, match=r"--nats-token-file .*: the file is empty"):
        config("--nats-token-file", empty)
    account_seed = write(tmp_path / "account.nk", new_seed(nkeys.PREFIX_BYTE_ACCOUNT))
    with pytest.raises(ConfigError, match="not a user nkey seed"):
        config("--nats-nkey-seed", account_seed)
    broken = write(tmp_path / "broken.nk", new_seed(nkeys.PREFIX_BYTE_USER)[:30])  # cut short
    with pytest.raises(ConfigError, match=r"--nats-nkey-seed .*: not a valid nkey seed"):
        config("--nats-nkey-seed", broken)
    with pytest.raises(ConfigError, match="not a NATS credentials file"):
        config("--nats-creds", write(tmp_path / "x.creds", "hello"))
    with pytest.raises(ConfigError, match=r"--nats-tls-ca .*: cannot load it"):
        config("--nats-tls-ca", write(tmp_path / "ca.pem", "not a certificate"))


def test_nkey_seed_and_creds_files_reach_nats_py(tmp_path):
    seed = new_seed(nkeys.PREFIX_BYTE_USER)
    seed_file = write(tmp_path / "user.nk", seed + "\n")
    cfg = config("--nats-nkey-seed", seed_file)
    assert cfg.auth.connect_options() == {"nkeys_seed": seed_file}  # nats-py reads the file on each connect
    assert seed not in repr(cfg) and seed not in cfg.auth.method
    creds = tmp_path / "svc.creds"
    Operator(tmp_path / "operator").creds(creds)
    assert config("--nats-creds", str(creds)).auth.connect_options() == {"user_credentials": str(creds)}
    with pytest.raises(ConfigError, match=r"given 2 ways \(--nats-nkey-seed, --nats-creds\)"):
        config("--nats-nkey-seed", seed_file, "--nats-creds", str(creds))
    assert public_key(seed).startswith("U")


def test_tls_files_build_a_verifying_context(tmp_path):
    ca = CertificateAuthority(tmp_path)
    client = ca.client("svc@embedfleet.test")
    cfg = config(
        "--nats-tls-ca",
        str(ca.pem.cert),
        "--nats-tls-cert",
        str(client.cert),
        "--nats-tls-key",
        str(client.key),
        "--nats-tls-hostname",
        "nats.embedfleet.test",
    )
    options = cfg.tls.connect_options()
    assert options["tls_hostname"] == "nats.embedfleet.test"
    context = options["tls"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "embedfleet test CA"),),)]
    assert config().tls.connect_options() == {}  # nats-py's default context, for tls:// URLs
    other = CertificateAuthority(tmp_path / "other").client("x@embedfleet.test")
    with pytest.raises(ConfigError, match=r"--nats-tls-cert .* / --nats-tls-key .*: cannot load them"):
        config("--nats-tls-cert", str(client.cert), "--nats-tls-key", str(other.key))


def test_up_hands_its_services_the_same_credentials_in_their_environment(tmp_path, monkeypatch):
    ca = CertificateAuthority(tmp_path)
    password_file = write(tmp_path / "password", SECRET)
    up = parse(
        "--nats",
        "nats://10.0.0.1:4222",
        "--nats-user",
        "svc",
        "--nats-password-file",
        password_file,
        "--nats-tls-ca",
        str(ca.pem.cert),
        command="up",
    )
    url, auth, tls = nats_security(up)
    stale = {"EMBEDFLEET_NATS_PASSWORD_FILE": "/elsewhere", TOKEN_ENV: "stale", "EMBEDFLEET_LOG_LEVEL": "debug"}
    env = child_environment(auth, tls, stale)
    assert env.pop("EMBEDFLEET_LOG_LEVEL") == "debug"  # the rest of the environment stays
    assert "EMBEDFLEET_NATS_PASSWORD_FILE" not in env and TOKEN_ENV not in env
    assert env[PASSWORD_ENV] == SECRET  # the environment, not arguments: ps shows arguments
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    child = config("--nats", url)
    assert (child.url, child.auth, child.tls.ca) == ("nats://10.0.0.1:4222", auth, str(ca.pem.cert.resolve()))
    # credentials in up's URL travel the same way, and leave the URL
    for name in env:
        monkeypatch.delenv(name)
    url, auth, tls = nats_security(parse("--nats", "nats://t0ken@10.0.0.1:4222", command="up"))
    assert url == "nats://10.0.0.1:4222" and child_environment(auth, tls, {}) == {TOKEN_ENV: "t0ken"}
    assert nats_security(parse(command="up"))[0] is None  # no URL: up starts an embedded server


def test_help_never_shows_a_secret(monkeypatch, capsys):
    monkeypatch.setenv(PASSWORD_ENV, "hunter2-secret")
    monkeypatch.setenv(TOKEN_ENV, "token-secret")
    with pytest.raises(SystemExit):
        parse("--help", command="gateway")
    text = capsys.readouterr().out
    assert "hunter2" not in text and "token-secret" not in text
    assert PASSWORD_ENV in text and TOKEN_ENV in text


def test_auth_errors_say_what_to_check_without_the_secret():
    cfg = NatsConfig("nats://a:4222", Subjects("embedfleet"), auth=NatsAuth(user="svc", password=SECRET))
    text = describe_error(nats.errors.Error("nats: 'Authorization Violation'"), cfg)
    assert text.startswith(
        "the server refused the credentials ('Authorization Violation'); this service gives user 'svc'"
    )
    assert "--nats-password-file" in text and SECRET not in text
    tls = describe_error(
        ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"), cfg
    )
    assert tls.startswith("TLS failed (") and "--nats-tls-ca" in tls
    assert describe_error(OSError("connect to nats://u:p@a:1 failed"), cfg) == "connect to nats://***@a:1 failed"


def test_repeated_warnings_are_logged_once_then_counted(caplog, monkeypatch):
    now = [100.0]
    monkeypatch.setattr("embedfleet.shared.nats.lifecycle.time.monotonic", lambda: now[0])
    warnings = RepeatFilter(every=30)
    with caplog.at_level(logging.WARNING, logger="embedfleet"):
        for step in range(61):  # twice a second for 30 s
            now[0] = 100.0 + step * 0.5
            warnings.warning("nats: refused")
        warnings.warning("nats: something else")
    assert [r.getMessage() for r in caplog.records] == [
        "nats: refused",
        "nats: refused (59 more times in 30s)",
        "nats: something else",
    ]


def test_a_bad_option_exits_2_with_the_message():
    result = subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", "tokenizer", "--nats-tls-cert", "/x.pem"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--nats-tls-cert needs --nats-tls-key" in result.stderr and "Traceback" not in result.stderr
