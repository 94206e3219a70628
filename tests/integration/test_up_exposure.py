"""What a real `embedfleet up` with API keys leaves open to web pages and local users: one stack for
the module, asked as an attacker would (a hostile Origin, Host and Content-Type with httpx, as curl
sends them; a job id made to alias another's route; the lock file, the NATS monitoring port and
/metrics read by whoever can), each refused or holding nothing secret; then up stops and takes its lock
file with it."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from embedfleet.shared.nats.server import free_port
from tests.integration.test_up import FIXED_BUDGET
from tests.support.procs import wait_until

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"
KEY, OPERATOR = "user-key-7f3a9c", "operator-key-51be0d"
APP = "https://app.example.com"  # the one web origin allowed
EVIL = "http://evil.example"
JOB = {"model": MODEL, "documents": [{"id": "a", "text": "planted by a web page"}]}


class Up:
    def __init__(self, proc: subprocess.Popen, data: Path, base: str, log: Path) -> None:
        self.proc, self.data, self.base, self.log = proc, data, base, log

    def post(self, path: str, body: bytes, **headers: str) -> httpx.Response:
        return httpx.post(f"{self.base}{path}", content=body, headers={"authorization": f"Bearer {KEY}", **headers})

    def jobs(self) -> list[str]:
        r = httpx.get(f"{self.base}/v1/jobs", headers={"authorization": f"Bearer {OPERATOR}"}, timeout=10)
        assert r.status_code == 200, r.text
        return sorted(j["id"] for j in r.json()["data"])


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    folder = tmp_path_factory.mktemp("up-exposure")
    data, log, port = folder / "data", folder / "up.log", free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "EMBEDFLEET_NATS_URL")}
    args = ["--data-dir", str(data), "--port", str(port), "--api-keys", KEY, "--operator-keys", OPERATOR]
    proc = subprocess.Popen(
        [sys.executable, "-m", "embedfleet.services.cli", "up", *args, "--allowed-origins", APP],
        stdout=open(log, "wb"),  # noqa: SIM115 (the child holds it)
        stderr=subprocess.STDOUT,
        env={**env, **FIXED_BUDGET},
    )
    stack = Up(proc, data, f"http://127.0.0.1:{port}", log)
    try:
        wait_until(lambda: "embedfleet is up" in log.read_text() or proc.poll() is not None, 180, "the stack")
        assert proc.poll() is None, log.read_text()[-3000:]
        yield stack
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


def test_a_web_pages_simple_post_is_refused_and_writes_nothing(up):
    """The attack: a page posts a job as text/plain (no preflight); the gateway used to take it (202)."""
    before = up.jobs()
    body = JOB | {"id": "from-a-page"}
    refused = up.post(
        "/v1/jobs", httpx.Request("POST", "/", json=body).content, origin=EVIL, **{"content-type": "text/plain"}
    )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden", refused.text
    assert "access-control-allow-origin" not in refused.headers
    plain = up.post("/v1/jobs", httpx.Request("POST", "/", json=body).content, **{"content-type": "text/plain"})
    assert plain.status_code == 415 and plain.json()["error"]["param"] == "content-type", plain.text
    form = up.post("/v1/embeddings", b"input=hi", **{"content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415, form.text
    assert up.jobs() == before  # nothing was written
    # the same job as a client sends it (no Origin, JSON) is taken: the refusals were of the page
    taken = up.post("/v1/jobs", httpx.Request("POST", "/", json=body).content, **{"content-type": "application/json"})
    assert taken.status_code == 202, taken.text
    assert up.jobs() == sorted([*before, "from-a-page"])


def test_a_host_the_gateway_is_not_served_as_is_refused(up):
    """DNS rebinding: a page of evil.example, its name now resolving to 127.0.0.1, reads the answers."""
    port = up.base.rsplit(":", 1)[1]
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
        r = httpx.get(f"{up.base}/v1/models", headers={"host": host, "authorization": f"Bearer {KEY}"})
        assert r.status_code == 403 and r.json()["error"]["param"] == "host", (host, r.text)
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
        r = httpx.get(f"{up.base}/v1/models", headers={"host": host, "authorization": f"Bearer {KEY}"})
        assert r.status_code == 200 and MODEL in [m["id"] for m in r.json()["data"]], (host, r.text)


def test_an_allowed_origins_page_gets_cors_and_only_it(up):
    preflight = {
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization,content-type",
    }
    allowed = httpx.options(f"{up.base}/v1/embeddings", headers={"origin": APP, **preflight})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == APP, allowed.text
    r = up.post(
        "/v1/embeddings",
        httpx.Request("POST", "/", json={"model": MODEL, "input": "hi"}).content,
        origin=APP,
        **{"content-type": "application/json"},
    )
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == APP
    refused = httpx.options(f"{up.base}/v1/embeddings", headers={"origin": EVIL, **preflight})
    assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers


def test_a_job_id_with_a_slash_is_refused_and_cannot_alias_a_job_s_route(up):
    before = up.jobs()
    r = up.post(
        "/v1/jobs",
        httpx.Request("POST", "/", json=JOB | {"id": "q/results"}).content,
        **{"content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "id", r.text
    assert "no '/' in a job id" in r.json()["error"]["message"]
    assert up.jobs() == before


def test_the_lock_file_is_the_owners_alone_and_holds_no_key(up):
    lock = up.data / "up.lock"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    text = lock.read_text()
    assert re.fullmatch(rf"pid {up.proc.pid} started \S+Z\n", text), text
    assert KEY not in text and OPERATOR not in text
    # a second up on the folder is refused, naming the holder with its keys hidden
    second = subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", "up", "--data-dir", str(up.data), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 2, second.stderr
    assert (
        f"is in use by pid {up.proc.pid} (" in second.stderr and "--api-keys *** --operator-keys ***" in second.stderr
    )
    assert KEY not in second.stderr and OPERATOR not in second.stderr


def test_nats_has_no_monitoring_port(up):
    (server,) = [p for p in psutil.Process(up.proc.pid).children(recursive=True) if p.name() == "nats-server"]
    listening = {c.laddr for c in server.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    assert len(listening) == 1 and next(iter(listening)).ip == "127.0.0.1", listening  # the client port alone
    conf = (up.data / "nats" / "nats-server.conf").read_text().splitlines()
    assert not [line for line in conf if line.startswith(("http", "monitor"))], conf


def test_metrics_name_keys_by_ids_no_one_can_test_a_guess_against(up):
    for key in (KEY, OPERATOR):
        httpx.get(f"{up.base}/v1/models", headers={"authorization": f"Bearer {key}"}).raise_for_status()
    metrics = httpx.get(f"{up.base}/metrics").text  # an open path
    labels = set(re.findall(r'key="([^"]*)"', metrics))
    logged = re.search(r"API keys' ids in metrics: #1 (\w+), #2 (\w+)", up.log.read_text())
    assert logged is not None, up.log.read_text()[-3000:]
    assert set(logged.groups()) <= labels  # the ids the gateway said at start are the keys' series
    for key in (KEY, OPERATOR):
        digest = hashlib.sha256(key.encode()).hexdigest()
        assert key not in metrics
        assert not any(label and digest.startswith(label) for label in labels), labels


def test_up_stopped_takes_its_lock_file_with_it(up):
    """Last in the module: stops the stack."""
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(60) == 0, up.log.read_text()[-3000:]
    assert not (up.data / "up.lock").exists()
