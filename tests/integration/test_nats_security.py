"""NATS credentials and TLS on real nats-servers and service processes.

For each way a server can ask a service to prove itself (user and password, token, nkey, operator
mode with a .creds file, TLS, mutual TLS), a tokenizer given the right credentials serves (it
answers a tokenize request from a test connection made with the same options), and one given wrong
or no credentials logs a clear error, keeps retrying, and stops at once on SIGTERM. No secret ever
reaches a log. `embedfleet up` runs a whole stack over TLS and a password given in its URL. The
embedded nats-server listens on the loopback interface only.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import nats.errors
import nkeys
import pytest

from embedfleet.services.cli.main import build_parser
from embedfleet.shared.config.sections.nats import PASSWORD_ENV, TOKEN_ENV
from embedfleet.shared.nats.config import NATS_SECURITY_ENV, NatsConfig, nats_config
from embedfleet.shared.nats.lifecycle import connect
from embedfleet.shared.nats.server import EmbeddedNats, free_port
from embedfleet.shared.protocol import TokenizeRequest, TokenizeResult, decode_as, encode
from tests.support.nats_secrets import CertificateAuthority, Operator, new_seed, public_key
from tests.support.procs import Service, wait_until

pytestmark = pytest.mark.integration

HELLO_WORLD = [101, 7592, 2088, 102]  # [CLS] hello world [SEP] in all-MiniLM-L6-v2's vocabulary
SERVER_NAME = "nats.embedfleet.test"  # the only name in the test server certificates
AUTH_REFUSED = "the server refused the credentials"
SERVER_AUTH_ERROR = "authentication error"
SERVER_TLS_ERROR = "TLS handshake error"


@pytest.fixture(autouse=True)
def _no_inherited_nats_options(monkeypatch):
    """Services start with the test's environment: none of the developer's NATS settings."""
    for name in (*NATS_SECURITY_ENV.values(), PASSWORD_ENV, TOKEN_ENV, "EMBEDFLEET_NATS_URL", "NATS_URL"):
        monkeypatch.delenv(name, raising=False)


@dataclass
class Credentials:
    """Command-line arguments (``--nats`` included) and environment variables for one process."""

    args: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def config(self, monkeypatch) -> NatsConfig:
        """The NatsConfig a service builds from these, for the test's own connection."""
        for name, value in self.env.items():
            monkeypatch.setenv(name, value)
        return nats_config(build_parser().parse_args(["tokenizer", *self.args]))


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


async def _tokenize(cfg: NatsConfig, model: str, service: Service, timeout: float) -> list[int]:
    """Ask the tokenizer (once it subscribed) for the ids of "hello world"."""
    nc = await asyncio.wait_for(connect(cfg, "embedfleet-test"), 20)
    try:
        deadline = time.monotonic() + timeout
        payload = encode(TokenizeRequest(id="security-test", model=model, texts=["hello world"]))
        while True:
            try:
                msg = await nc.request(cfg.subjects.tokenize(model), payload, timeout=2)
                return [token[0] for token in decode_as(msg.data, TokenizeResult).tokens[0]]
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                if time.monotonic() > deadline or not service.alive:
                    raise AssertionError(f"the tokenizer never answered:\n{service.log()[-3000:]}") from None
                await asyncio.sleep(0.1)
    finally:
        await nc.close()


@pytest.fixture
def check(tmp_path, model_info, monkeypatch) -> Callable[..., None]:
    """``check(server, good, bad, secrets, refused, server_error)``: a tokenizer with ``good``
    serves; one with ``bad`` logs ``refused`` and keeps trying (the server logs ``server_error`` for
    each try) until SIGTERM ends it at once; no log holds any of ``secrets``."""

    def run(
        server: EmbeddedNats,
        good: Credentials,
        bad: Credentials,
        secrets: list[str],
        refused: str = AUTH_REFUSED,
        server_error: str = SERVER_AUTH_ERROR,
    ) -> None:
        log_dir = tmp_path / "logs"
        log_dir.mkdir(exist_ok=True)
        serving = Service("tokenizer", good.args, log_dir, good.env)
        refused_one = Service("tokenizer", bad.args, log_dir, bad.env)
        server_log = server.data_dir / "nats-server.log"
        try:
            assert asyncio.run(_tokenize(good.config(monkeypatch), model_info.id, serving, 60)) == HELLO_WORLD
            wait_until(
                lambda: refused in refused_one.log(), 30, f"{refused!r} in the refused tokenizer's log", [refused_one]
            )
            tries = server_log.read_text().count(server_error)
            wait_until(
                lambda: server_log.read_text().count(server_error) >= tries + 2, 30, "two more tries", [refused_one]
            )
            assert refused_one.alive
        finally:
            codes = (serving.stop(timeout=20), refused_one.stop(timeout=20))
        assert codes == (0, 0), refused_one.log()[-2000:]
        assert "stopped before NATS accepted it" in refused_one.log()
        assert "tokenizer ready (nats nats://127.0.0.1:" in serving.log()
        for service in (serving, refused_one):
            text = service.log()
            assert not [s for s in secrets if s in text], f"{service.role} logged a secret:\n{text[-3000:]}"

    return run


def test_user_and_password(tmp_path, check):
    password = "pw-" + os.urandom(8).hex()
    server = EmbeddedNats(tmp_path / "nats", config=f'authorization {{\n  user: svc\n  password: "{password}"\n}}\n')
    with server:
        good = Credentials(
            [
                "--nats",
                server.url,
                "--nats-user",
                "svc",
                "--nats-password-file",
                write(tmp_path / "password", password + "\n"),
            ]
        )
        # the wrong password inside the URL: the URL that is logged must not show it
        wrong = "pw-wrong-" + os.urandom(8).hex()
        bad = Credentials(["--nats", server.url.replace("nats://", f"nats://svc:{wrong}@")])
        check(server, good, bad, [password, wrong])


def test_token(tmp_path, check):
    token = "tok-" + os.urandom(8).hex()
    server = EmbeddedNats(tmp_path / "nats", config=f'authorization {{\n  token: "{token}"\n}}\n')
    with server:
        good = Credentials(["--nats", server.url.replace("nats://", f"nats://{token}@")])  # nats://TOKEN@host
        wrong = "tok-wrong-" + os.urandom(8).hex()
        bad = Credentials(["--nats", server.url], {TOKEN_ENV: wrong})
        check(server, good, bad, [token, wrong])
        # the one-shot commands connect the same way: init creates the streams
        init = subprocess.run(
            [
                sys.executable,
                "-m",
                "embedfleet.services.cli",
                "init",
                "--nats",
                server.url,
                "--nats-token-file",
                write(tmp_path / "token", token),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert init.returncode == 0, init.stderr
    assert f"are in place on {server.url}" in init.stdout
    assert token not in init.stdout + init.stderr


def test_nkey(tmp_path, check):
    seed = new_seed(nkeys.PREFIX_BYTE_USER)
    server = EmbeddedNats(tmp_path / "nats", config=f"authorization {{\n  users: [{{nkey: {public_key(seed)}}}]\n}}\n")
    with server:
        good = Credentials(["--nats", server.url, "--nats-nkey-seed", write(tmp_path / "user.nk", seed + "\n")])
        stranger = new_seed(nkeys.PREFIX_BYTE_USER)  # a valid seed the server does not know
        bad = Credentials(["--nats", server.url, "--nats-nkey-seed", write(tmp_path / "stranger.nk", stranger)])
        check(server, good, bad, [seed, stranger])


def test_creds_file_in_operator_mode(tmp_path, check):
    operator = Operator(tmp_path / "operator")
    server = EmbeddedNats(tmp_path / "nats", config=operator.server_config())
    with server:
        seed = operator.creds(tmp_path / "svc.creds")
        good = Credentials(["--nats", server.url, "--nats-creds", str(tmp_path / "svc.creds")])
        # a user signed by an account the server was never given
        stranger = operator.creds(tmp_path / "stranger.creds", account_seed=new_seed(nkeys.PREFIX_BYTE_ACCOUNT))
        bad = Credentials(["--nats", server.url, "--nats-creds", str(tmp_path / "stranger.creds")])
        check(server, good, bad, [seed, stranger])


def _tls_config(ca: CertificateAuthority, client_certificates: bool = False) -> str:
    server = ca.server(SERVER_NAME)
    verify = f'  ca_file: "{ca.pem.cert}"\n  verify_and_map: true\n' if client_certificates else ""
    return f'tls {{\n  cert_file: "{server.cert}"\n  key_file: "{server.key}"\n{verify}}}\n'


def test_tls_without_the_ca_is_refused(tmp_path, check):
    ca = CertificateAuthority(tmp_path / "tls")
    server = EmbeddedNats(tmp_path / "nats", config=_tls_config(ca))
    with server:
        good = Credentials(
            ["--nats", server.url, "--nats-tls-ca", str(ca.pem.cert), "--nats-tls-hostname", SERVER_NAME]
        )
        bad = Credentials(["--nats", server.url, "--nats-tls-hostname", SERVER_NAME])  # the system's CAs only
        check(server, good, bad, [], refused="TLS failed", server_error=SERVER_TLS_ERROR)


def test_mutual_tls_maps_the_client_certificate_to_a_user(tmp_path, check):
    ca = CertificateAuthority(tmp_path / "tls")
    client = ca.client("svc@embedfleet.test")
    config = (
        _tls_config(ca, client_certificates=True) + 'authorization {\n  users: [{user: "svc@embedfleet.test"}]\n}\n'
    )
    server = EmbeddedNats(tmp_path / "nats", config=config)
    with server:
        tls = ["--nats-tls-ca", str(ca.pem.cert), "--nats-tls-hostname", SERVER_NAME]
        good = Credentials(
            ["--nats", server.url, *tls, "--nats-tls-cert", str(client.cert), "--nats-tls-key", str(client.key)]
        )
        # a certificate from the right CA for a user the server does not know
        stranger = ca.client("stranger@embedfleet.test")
        bad = Credentials(
            ["--nats", server.url, *tls, "--nats-tls-cert", str(stranger.cert), "--nats-tls-key", str(stranger.key)]
        )
        check(server, good, bad, [])


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_up_runs_the_stack_over_tls_with_a_password_from_its_url(tmp_path, model_info):
    """`embedfleet up --nats nats://USER:PASSWORD@...`: the services get the password in their
    environment (never in arguments, which ps shows), verify the server with the CA, and answer."""
    ca = CertificateAuthority(tmp_path / "tls")
    password = "pw-" + os.urandom(8).hex()
    auth = f'authorization {{\n  user: svc\n  password: "{password}"\n}}\n'
    server = EmbeddedNats(tmp_path / "nats", config=_tls_config(ca) + auth)
    port = free_port()
    log = tmp_path / "up.log"
    with server:
        url = server.url.replace("nats://", f"nats://svc:{password}@")
        # a fixed engine budget (no calibration) and one thread: the worker inherits the environment
        env = {**os.environ, "EMBEDFLEET_MAX_BATCH_TOKENS": "1024", "OMP_NUM_THREADS": "1"}
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "embedfleet.services.cli",
                    "up",
                    "--data-dir",
                    str(tmp_path / "data"),
                    "--port",
                    str(port),
                    "--nats",
                    url,
                    "--nats-tls-ca",
                    str(ca.pem.cert),
                    "--nats-tls-hostname",
                    SERVER_NAME,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        try:
            wait_until(lambda: "embedfleet is up" in log.read_text() or proc.poll() is not None, 120, "the stack")
            assert proc.poll() is None, log.read_text()[-3000:]
            assert f"NATS {server.url}" in log.read_text()  # the URL without its credentials
            children = _children(proc.pid)
            assert len(children) == 4  # tokenizer, worker, scorer, gateway
            for child in children:
                assert password not in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace")
            r = httpx.post(
                f"http://127.0.0.1:{port}/v1/embeddings",
                json={"model": model_info.id, "input": ["hello world", "over TLS"]},
                timeout=60,
            )
            assert r.status_code == 200, r.text
            vectors = [d["embedding"] for d in r.json()["data"]]
            assert [len(v) for v in vectors] == [384, 384]
            assert all(abs(sum(x * x for x in v) - 1) < 1e-4 for v in vectors)  # normalised
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert password not in text


def _non_loopback_address() -> str | None:
    """This machine's address on its default route, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


def test_embedded_server_listens_on_loopback_only(tmp_path):
    with EmbeddedNats(tmp_path / "nats", monitor=True) as server:  # monitoring: off unless asked for
        with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/varz", timeout=5) as resp:
            varz = json.loads(resp.read())
        assert (varz["host"], varz["port"]) == ("127.0.0.1", server.port)
        assert (varz["http_host"], varz["http_port"]) == ("127.0.0.1", server.monitor_port)
        address = _non_loopback_address()
        if address is not None:  # reachable on loopback, refused on the machine's other address
            for port in (server.port, server.monitor_port):
                with socket.create_connection(("127.0.0.1", port), timeout=5):
                    pass
                with socket.socket() as s:
                    s.settimeout(5)
                    assert s.connect_ex((address, port)) != 0, f"port {port} answers on {address}"
