"""Work nobody waits for is dropped, on real processes: a gateway, a tokenizer and a one-thread worker.

- A client that leaves before its answer: the gateway sends a Cancel bound to the request (its random
  cancel key), the worker drops the request's queued rows, and the next client is answered at once,
  not after the abandoned work.
- A Cancel from another NATS connection that knows the request's id but not its key cancels nothing.
- A forged token batch costs at most what fits before its deadline: one of 100,000 rows is refused as
  it comes, one within the row limit stops at its deadline (a timeout for the rest); an online request
  sent right after either is answered within a bound.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import nats
import numpy as np
import pytest

from embedfleet.services.gpu_worker.service import ROWS_PER_BATCH
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.nats.server import EmbeddedNats, free_port
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import (
    Cancel,
    EmbedRequest,
    ErrorReply,
    Requests,
    TokenChunk,
    decode,
    decode_as,
    encode,
)
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.support.corpus import medium_texts
from tests.support.procs import Service, holds_rows, running, wait_until
from tests.support.prometheus_text import samples
from tests.support.waiting import eventually

# timings are asserted: the machine to this module's processes
pytestmark = [pytest.mark.integration, pytest.mark.serial]

MODEL = "all-MiniLM-L6-v2"
SUBJECTS = Subjects()
SLOW = medium_texts(800)  # ~40k tokens (~200 KB of body): tens of seconds of work for a one-thread worker
MEDIUM = medium_texts(80)  # seconds of work
SHORT = ["The quick brown fox jumps over the lazy dog.", "embedfleet serves embeddings"]
# seconds within which a short request is answered once the work before it is dropped (a loaded
# two-core machine; the work dropped would take far longer)
ANSWERED_WITHIN = 3.0
MAX_BATCH_SEQS = 256  # the worker's --max-batch-seqs (its default)


@dataclass
class Fleet:
    nats: EmbeddedNats
    folder: Path
    port: int = field(default_factory=free_port)
    worker_metrics: int = field(default_factory=free_port)
    services: dict[str, Service] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def dropped(self, reason: str) -> float:
        """Rows the worker dropped for ``reason`` (cancelled, expired) so far."""
        text = httpx.get(f"http://127.0.0.1:{self.worker_metrics}/metrics", timeout=5).text
        key = ("embedfleet_worker_dropped_rows_total", frozenset({"model": MODEL, "reason": reason}.items()))
        return samples(text).get(key, 0.0)

    def holds_rows(self) -> bool:
        return holds_rows(self.worker_metrics, MODEL)

    def idle(self) -> None:
        """The worker's queue empty (what a test left there run or dropped)."""
        wait_until(lambda: not self.holds_rows(), 120, "the worker's queue empty", list(self.services.values()))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[Fleet]:
    folder = tmp_path_factory.mktemp("abandoned")
    server = EmbeddedNats(folder / "nats")
    server.start()
    f = Fleet(server, folder)
    common = ["--nats", server.url]
    try:
        # small token batches: a request's rows wait in the worker as many batches
        f.services["tokenizer"] = Service("tokenizer", [*common, "--chunk-seqs", "8"], folder)
        f.services["worker"] = Service(
            "worker",
            [*common, "--max-batch-tokens", "512", "--metrics-port", str(f.worker_metrics)],
            folder,
            {"OMP_NUM_THREADS": "1"},
        )
        f.services["gateway"] = Service("gateway", [*common, "--port", str(f.port), "--request-timeout", "120"], folder)
        with running(f.services, server.url, f.base_url):
            yield f
    finally:
        server.stop()


def _embed(fleet: Fleet, texts: list[str], timeout: float = 120) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    r = httpx.post(f"{fleet.base_url}/v1/embeddings", json={"model": MODEL, "input": texts}, timeout=timeout)
    return r, time.monotonic() - started


def _vectors(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def _open_request(fleet: Fleet, texts: list[str]) -> socket.socket:
    """An embeddings request sent on a raw connection, its answer not read (the caller closes it)."""
    body = json.dumps({"model": MODEL, "input": texts}).encode()
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:{fleet.port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", fleet.port), timeout=10)
    sock.sendall(head + body)
    return sock


def test_a_client_that_left_costs_the_next_request_nothing(fleet: Fleet, reference):
    fleet.idle()
    before = fleet.dropped("cancelled")
    sock = _open_request(fleet, SLOW)
    wait_until(fleet.holds_rows, 60, "the worker holding the slow request's rows", list(fleet.services.values()))
    sock.close()  # the client gives up
    r, took = _embed(fleet, SHORT)
    c = cosines(_vectors(r), reference.encode(SHORT))
    assert c.min() >= COSINE_TOLERANCE, c
    assert took < ANSWERED_WITHIN, f"answered in {took:.1f}s, behind the abandoned request's rows"
    # the abandoned rows were dropped, not run: most of them
    dropped = fleet.dropped("cancelled") - before
    assert dropped >= len(SLOW) / 2, dropped
    assert "cancelled by its requester" in fleet.services["worker"].log()
    fleet.idle()


async def _sniffed_request(url: str) -> tuple[nats.NATS, asyncio.Future[EmbedRequest]]:
    """A connection that reads the next EmbedRequest of MODEL (as a tokenizer would: this test server has
    no permissions), and the future of that request."""
    nc = await nats.connect(url)
    seen: asyncio.Future[EmbedRequest] = asyncio.get_running_loop().create_future()

    async def on_request(msg) -> None:
        message = decode(msg.data)
        inner = [decode_as(m, EmbedRequest) for m in message.messages] if isinstance(message, Requests) else [message]
        if not seen.done() and isinstance(inner[0], EmbedRequest):
            seen.set_result(inner[0])

    await nc.subscribe(SUBJECTS.embed(MODEL), cb=on_request)
    await nc.flush()
    return nc, seen


def test_a_cancel_without_the_requests_key_cancels_nothing(fleet: Fleet, reference):
    fleet.idle()
    before = fleet.dropped("cancelled")

    async def run() -> tuple[httpx.Response, EmbedRequest]:
        nc, seen = await _sniffed_request(fleet.nats.url)
        try:
            async with httpx.AsyncClient(timeout=120) as client:
                answer = asyncio.ensure_future(
                    client.post(f"{fleet.base_url}/v1/embeddings", json={"model": MODEL, "input": MEDIUM})
                )
                request = await asyncio.wait_for(seen, 30)
                assert request.cancel_key is not None and len(request.cancel_key) == 16
                guesses = [os.urandom(16), bytes(16), request.id.encode()[:16].ljust(16, b"\0")]

                async def forge() -> None:
                    for key in guesses:
                        await nc.publish(SUBJECTS.cancel(MODEL), encode(Cancel(request.id, key, time.time() + 60)))
                    await nc.flush()

                await forge()  # before the worker holds the rows: remembered, and matching none of them
                await eventually(lambda: fleet.holds_rows() or answer.done(), 30, "the worker holding the rows")
                await forge()  # while it holds them
                return await answer, request
        finally:
            await nc.close()

    r, request = asyncio.run(run())
    c = cosines(_vectors(r), reference.encode(MEDIUM))
    assert len(c) == len(MEDIUM) and c.min() >= COSINE_TOLERANCE, c
    assert fleet.dropped("cancelled") == before
    assert f"request {request.id}: cancelled" not in fleet.services["worker"].log()


async def _forge_batch(url: str, rows: int, tokens_per_row: int, deadline: float) -> tuple[nats.NATS, asyncio.Queue]:
    """A token batch of ``rows`` rows published on the workers' subject as a tokenizer's; the queue of its answers."""
    nc = await nats.connect(url)
    answers: asyncio.Queue = asyncio.Queue()
    inbox = nc.new_inbox()

    async def on_answer(msg) -> None:
        answers.put_nowait(decode(msg.data))

    await nc.subscribe(inbox, cb=on_answer)
    row = [101] + [2023] * (tokens_per_row - 2) + [102] if tokens_per_row > 1 else [101]
    ids = np.tile(np.array(row, "<i4"), rows)
    cu = np.arange(0, rows * tokens_per_row + 1, tokens_per_row, dtype="<i4")
    batch = TokenChunk(f"forged-{rows}", MODEL, 0, rows, ids, cu, deadline)
    payload = encode(batch)
    assert len(payload) < nc.max_payload
    await nc.publish(SUBJECTS.tokens(MODEL), payload, reply=inbox)
    await nc.flush()
    return nc, answers


def test_a_forged_batch_of_100000_rows_is_refused_as_it_comes(fleet: Fleet, reference):
    fleet.idle()

    async def run() -> tuple[ErrorReply, tuple[httpx.Response, float]]:
        nc, answers = await _forge_batch(fleet.nats.url, 100_000, 1, time.time() + 1.0)
        try:
            online = asyncio.ensure_future(asyncio.to_thread(_embed, fleet, SHORT))
            refusal = await asyncio.wait_for(answers.get(), 10)
            return refusal, await online
        finally:
            await nc.close()

    refusal, (r, took) = asyncio.run(run())
    assert isinstance(refusal, ErrorReply) and refusal.code is ErrorCode.INVALID_REQUEST, refusal
    assert f"limit of {ROWS_PER_BATCH * MAX_BATCH_SEQS}" in refusal.message, refusal.message
    assert cosines(_vectors(r), reference.encode(SHORT)).min() >= COSINE_TOLERANCE
    assert took < ANSWERED_WITHIN, f"answered in {took:.1f}s"


def test_a_forged_batch_stops_at_its_deadline(fleet: Fleet, reference):
    fleet.idle()
    before = fleet.dropped("expired")
    rows = ROWS_PER_BATCH * MAX_BATCH_SEQS  # the most one batch may hold: ~130k tokens, many seconds of work

    async def run() -> tuple[ErrorReply, float, tuple[httpx.Response, float]]:
        started = time.monotonic()
        nc, answers = await _forge_batch(fleet.nats.url, rows, 8, time.time() + 1.0)
        try:
            await eventually(fleet.holds_rows, 10, "the worker holding the forged rows")
            online = asyncio.ensure_future(asyncio.to_thread(_embed, fleet, SHORT))  # queued behind it
            answer = await asyncio.wait_for(answers.get(), 30)
            return answer, time.monotonic() - started, await online
        finally:
            await nc.close()

    answer, answered_in, (r, took) = asyncio.run(run())
    assert isinstance(answer, ErrorReply) and answer.code is ErrorCode.TIMEOUT, answer
    assert answered_in < 1.0 + ANSWERED_WITHIN, answered_in
    assert cosines(_vectors(r), reference.encode(SHORT)).min() >= COSINE_TOLERANCE
    assert took < ANSWERED_WITHIN, f"answered in {took:.1f}s, behind the forged batch"
    assert fleet.dropped("expired") - before >= rows / 2


def test_a_request_whose_cancel_came_first_is_dropped_by_the_tokenizer(fleet: Fleet):
    """The tokenizer remembers a Cancel's key: the request it names is never tokenized nor sent on,
    while the same request under another key is answered."""
    fleet.idle()
    worker_rows = fleet.dropped("cancelled")

    async def run() -> tuple[list, list]:
        nc = await nats.connect(fleet.nats.url)
        answers: dict[str, list] = {"cancelled": [], "kept": []}
        inbox = nc.new_inbox()

        async def on_answer(msg) -> None:
            answers[msg.subject.rsplit(".", 1)[1]].append(decode(msg.data))

        await nc.subscribe(f"{inbox}.*", cb=on_answer)
        key, other = os.urandom(16), os.urandom(16)
        deadline = time.time() + 30
        await nc.publish(SUBJECTS.cancel(MODEL), encode(Cancel("first", key, deadline)))
        await nc.flush()
        for name, cancel_key in (("cancelled", key), ("kept", other)):
            request = EmbedRequest(name, MODEL, SHORT, deadline, cancel_key=cancel_key)
            await nc.publish(SUBJECTS.embed(MODEL), encode(request), reply=f"{inbox}.{name}")
        await nc.flush()
        await eventually(lambda: len(answers["kept"]) >= 1, 30, "the kept request's answer")
        await asyncio.sleep(1.0)  # room for an answer to the cancelled one, were any coming
        await nc.close()
        return answers["cancelled"], answers["kept"]

    cancelled, kept = asyncio.run(run())
    assert cancelled == []
    assert [type(a).__name__ for a in kept] == ["EmbedResult"], kept
    assert "request cancelled: cancelled by its requester: 2 inputs dropped queued" in fleet.services["tokenizer"].log()
    assert fleet.dropped("cancelled") == worker_rows  # nothing of it reached the worker
