"""The gateway's edge against hostile or careless clients, over raw sockets to a real gateway process
(and a real tokenizer and worker): header size and count, slow headers and bodies, clients that go
away mid-body or mid-request, admission of every route, job ids that name no subject, and token IDs
outside the vocabulary."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from embedfleet.shared.nats.server import free_port
from tests.support.procs import Service, healthy, wait_until
from tests.support.prometheus_text import has, value

pytestmark = pytest.mark.integration

HEADER_TIMEOUT = 2.0  # seconds, the gateway's --header-timeout here
BODY_TIMEOUT = 2.0
MAX_HEADERS = 20
# the limits travel as variables: a gateway that knows them not still starts (and fails the tests)
LIMITS = {
    "EMBEDFLEET_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
    "EMBEDFLEET_BODY_TIMEOUT": str(BODY_TIMEOUT),
    "EMBEDFLEET_MAX_HEADERS": str(MAX_HEADERS),
    "EMBEDFLEET_MAX_IN_FLIGHT": "1",
}


class Edge:
    def __init__(self, base_url: str, port: int, gateway: Service, worker: Service) -> None:
        self.base_url, self.port, self.gateway, self.worker = base_url, port, gateway, worker

    def metrics(self) -> str:
        return httpx.get(f"{self.base_url}/metrics", timeout=10).text

    def sample(self, name: str, **labels: str) -> float:
        text = self.metrics()
        return value(text, name, **labels) if has(text, name, **labels) else 0.0


@pytest.fixture(scope="module")
def edge(nats_url: str, tmp_path_factory) -> Iterator[Edge]:
    """A tokenizer, a worker and a gateway of their own subjects; the gateway polls its fleet seldom, so
    that a stopped worker is not taken for dead while a test holds it."""
    log_dir = tmp_path_factory.mktemp("edge")
    common = ["--nats", nats_url, "--subject-prefix", f"edge{uuid.uuid4().hex[:8]}"]
    port = free_port()
    tokenizer = Service("tokenizer", common, log_dir)
    worker = Service("worker", [*common, "--max-batch-tokens", "1024"], log_dir, {"OMP_NUM_THREADS": "1"})
    gateway = Service(
        "gateway",
        [*common, "--port", str(port), "--discovery-interval", "60", "--request-timeout", "60"],
        log_dir,
        LIMITS,
    )
    services = [tokenizer, worker, gateway]
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthy(base_url), 180, "gateway health", services)
        yield Edge(base_url, port, gateway, worker)
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)
        for s in services:
            s.stop()


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def _answer(sock: socket.socket) -> bytes:
    """All the server sends until it closes the connection (or a complete answer that keeps it open)."""
    data = b""
    while True:
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not part:
            return data
        data += part
        head, _, body = data.partition(b"\r\n\r\n")
        length = [
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        ]
        if length and len(body) >= length[0]:
            return data


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    """Send what the server may refuse to read to the end (it answers and closes meanwhile)."""
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _rss_mb(pid: int) -> float:
    line = next(s for s in Path(f"/proc/{pid}/status").read_text().splitlines() if s.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_oversize_headers_are_refused_431_at_once_and_others_are_served(edge):
    rss = _rss_mb(edge.gateway.proc.pid)
    sock = _connect(edge.port)
    big = b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * (32 << 20)  # 32 MB, never ended
    start = time.monotonic()
    # the first bytes over the limit go at once, from here: on a loaded machine a thread may start
    # later than the header timeout, and the gateway would rightly answer 408 to a connection silent
    _send_quietly(sock, big[: 2 << 16])
    sender = threading.Thread(target=_send_quietly, args=(sock, big[2 << 16 :]))
    sender.start()
    # meanwhile an ordinary request is answered at once
    took = time.monotonic()
    assert httpx.get(f"{edge.base_url}/openapi.json", timeout=10).status_code == 200
    took = time.monotonic() - took
    answer = _answer(sock)
    waited = time.monotonic() - start
    sender.join(30)
    sock.close()
    assert _status(answer) == 431, answer[:200]
    assert b"request headers over 65536 bytes" in answer
    assert waited < 3.0 and took < 2.0, (waited, took)
    assert _rss_mb(edge.gateway.proc.pid) - rss < 16, (rss, _rss_mb(edge.gateway.proc.pid))  # the 32 MB never held


def test_too_many_headers_are_refused_431(edge):
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(MAX_HEADERS + 1))
    with _connect(edge.port) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n" + headers + b"\r\n")
        answer = _answer(sock)
    assert _status(answer) == 431 and answer.endswith(b"over 20 header fields"), answer
    with _connect(edge.port) as sock:  # at the limit: served
        sock.sendall(
            b"GET /v1/models HTTP/1.1\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(MAX_HEADERS)) + b"\r\n"
        )
        assert _status(_answer(sock)) == 200


@pytest.mark.parametrize(
    "sent", [b"", b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Slow: "], ids=["nothing", "half-headers"]
)
def test_slow_headers_are_answered_408_after_the_header_timeout(edge, sent):
    with _connect(edge.port) as sock:
        start = time.monotonic()
        sock.sendall(sent)
        answer = _answer(sock)
        waited = time.monotonic() - start
    assert _status(answer) == 408 and b"the request's headers took over 2s" in answer, answer
    assert HEADER_TIMEOUT - 0.2 < waited < HEADER_TIMEOUT + 3.0, waited


def test_slow_headers_of_a_kept_alive_connection_s_next_request_are_answered_408(edge):
    with _connect(edge.port) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert _status(_answer(sock)) == 200
        start = time.monotonic()
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        answer = _answer(sock)
        waited = time.monotonic() - start
    assert _status(answer) == 408 and b"the request's headers took over 2s" in answer, answer
    assert HEADER_TIMEOUT - 0.2 < waited < HEADER_TIMEOUT + 3.0, waited


def test_a_slow_body_is_answered_408_after_the_body_timeout(edge):
    before = edge.sample("embedfleet_errors_total", route="/embed", code="500")
    with _connect(edge.port) as sock:
        sock.sendall(
            b"POST /embed HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            b'{"inputs": '
        )
        start = time.monotonic()
        answer = _answer(sock)
        waited = time.monotonic() - start
    assert _status(answer) == 408 and b"the request's body took over 2s" in answer, answer
    assert BODY_TIMEOUT - 0.2 < waited < BODY_TIMEOUT + 3.0, waited
    wait_until(lambda: edge.sample("embedfleet_requests_in_flight") == 0, 10, "the slot given back")
    assert edge.sample("embedfleet_errors_total", route="/embed", code="500") == before


def test_a_client_leaving_mid_body_is_counted_as_disconnected_in_one_log_line(edge):
    log_before = edge.gateway.log()
    gone_before = edge.sample("embedfleet_requests_total", route="/embed", code="disconnected")
    errors_before = edge.sample("embedfleet_errors_total", route="/embed", code="500")
    for i in range(1, 4):  # one after the other: the gateway takes one request at a time here
        with _connect(edge.port) as sock:
            sock.sendall(
                b"POST /embed HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                b'{"inputs": "' + b"a" * 400
            )
        wait_until(
            lambda i=i: (
                edge.sample("embedfleet_requests_total", route="/embed", code="disconnected") == gone_before + i
            ),
            10,
            f"disconnection {i} counted",
            [edge.gateway],
        )
    assert edge.sample("embedfleet_errors_total", route="/embed", code="500") == errors_before
    assert edge.sample("embedfleet_requests_in_flight") == 0
    new = edge.gateway.log()[len(log_before) :]
    assert "Traceback" not in new and "Exception in ASGI" not in new and "unhandled error" not in new, new
    assert new.count("POST /embed: the client went away after") == 3, new


def test_a_client_gone_mid_request_frees_its_slot_and_every_route_is_admitted(edge):
    """The worker stopped, a request waits for it; /v1/jobs is refused 429 meanwhile (--max-in-flight 1
    covers it); the client leaves and its slot is free again at once, not after --request-timeout."""
    os.kill(edge.worker.proc.pid, signal.SIGSTOP)
    try:
        sock = _connect(edge.port)
        body = b'{"inputs": "a request its client will not wait for"}'
        sock.sendall(
            b"POST /embed HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body)
        )
        wait_until(lambda: edge.sample("embedfleet_requests_in_flight") == 1, 10, "the request in flight")
        start = time.monotonic()
        r = httpx.post(f"{edge.base_url}/v1/jobs", json={"documents": [{"id": "1", "text": "x"}]}, timeout=10)
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error", r.text
        assert time.monotonic() - start < 2.0
        gone_before = edge.sample("embedfleet_requests_total", route="/embed", code="disconnected")
        sock.close()
        left = time.monotonic()
        wait_until(lambda: edge.sample("embedfleet_requests_in_flight") == 0, 5, "the slot given back")
        freed = time.monotonic() - left
        assert edge.sample("embedfleet_requests_total", route="/embed", code="disconnected") == gone_before + 1
        assert freed < 5.0
    finally:
        os.kill(edge.worker.proc.pid, signal.SIGCONT)


@pytest.mark.parametrize("job", ["a..b", ".a", "a.", ""])
def test_a_job_id_with_an_empty_token_is_refused_400_at_once(edge, job):
    start = time.monotonic()
    r = httpx.post(f"{edge.base_url}/v1/jobs", json={"id": job, "documents": [{"id": "1", "text": "x"}]}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "id", "invalid_request")
    assert error["message"].startswith(f"invalid job id {job!r}: at most 128 letters")
    if job:  # GET and DELETE /v1/jobs/ name no job at all (another route)
        for method in ("GET", "DELETE"):
            r = httpx.request(method, f"{edge.base_url}/v1/jobs/{job}", timeout=30)
            assert r.status_code == 400 and r.json()["error"]["param"] == "id", (method, r.text)
    assert time.monotonic() - start < 5.0


def test_decode_refuses_a_token_id_outside_the_vocabulary_422(edge):
    r = httpx.post(f"{edge.base_url}/decode", json={"ids": [[101, 7592, 102], [101, 30522]]}, timeout=30)
    assert r.status_code == 422, r.text
    assert r.json() == {
        "error": "token id 30522 (ids[1][1]) is outside the vocabulary of 30522 ids [0, 30522)",
        "error_type": "Validation",
    }
    r = httpx.post(f"{edge.base_url}/decode", json={"ids": [101, 7592, 102]}, timeout=30)
    assert r.status_code == 200 and r.json() == ["hello"]
