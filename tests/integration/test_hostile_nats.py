"""Hostile messages on every NATS subject the running services listen on.

Random bytes, wrong versions and types, huge claimed sizes, truncated encodings, out-of-vocabulary
token ids, payloads just under the server's limit: thrown (by hand and by hypothesis, in bursts) at
the tokenizer, the workers (shared and direct subjects), the scorer, the load reports, the bulk
JetStream subjects, the service-discovery and advisory subjects. Each request with a reply subject
gets a prompt, readable refusal (or, where the damage left a valid message, a real answer); bulk
messages become dead letters; afterwards every process is alive and the stack answers a real
/v1/embeddings request with the vectors it gave before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

import httpx
import msgpack
import nats
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.jobs.streams import stream_names
from embedfleet.shared.jobs.work_queue import TRUNCATED
from embedfleet.shared.nats.subjects import SERVICE_NAMES, Subjects
from embedfleet.shared.protocol import (
    MAX_ID,
    MAX_STAGES,
    VERSION,
    DecodeRequest,
    DecodeResult,
    EmbedOptions,
    EmbedRequest,
    EmbedResult,
    ErrorReply,
    Held,
    JobBatch,
    LoadReport,
    ProtocolError,
    Replies,
    Requests,
    RerankRequest,
    RerankResult,
    TokenChunk,
    TokenizeRequest,
    TokenizeResult,
    decode,
    decode_as,
    encode,
)
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.shared.protocol.test_fuzz import VALID, deeply_nested, hostile, token_chunks, with_raw_field
from tests.support.procs import service_counts, wait_until
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"
VOCAB = 30522
SUBJECTS = Subjects()
REPLY_TIMEOUT = 30.0
# what a service may answer an untrusted message with; INTERNAL would mean an unexpected exception
REFUSALS = {
    ErrorCode.INVALID_REQUEST,
    ErrorCode.INVALID_TOKENS,
    ErrorCode.INPUT_TOO_LONG,
    ErrorCode.MODEL_NOT_FOUND,
    ErrorCode.TIMEOUT,
}
CLEAN_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "embedfleet serves embeddings",
    "Une phrase en français.",
]
SLOW_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]
BURSTS = settings(max_examples=6, deadline=None, suppress_health_check=SLOW_OK)

# -- what to throw ---------------------------------------------------------------------------------

soon = st.builds(lambda: time.time() + 30)  # a deadline still ahead when the message arrives
short_texts = st.lists(st.text(max_size=20), min_size=1, max_size=3)
in_vocab = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)


@st.composite
def batches_for_the_model(draw, job: bool = False) -> TokenChunk:
    rows = draw(st.lists(in_vocab, min_size=1, max_size=3))
    cu = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype("<i4")
    name = draw(st.text("abc", min_size=1, max_size=8)) if job else None
    return TokenChunk(
        draw(st.text(max_size=8)),
        MODEL,
        0,
        len(rows),
        np.array([t for r in rows for t in r], "<i4"),
        cu,
        draw(soon),
        job=name,
        doc_ids=[f"d{i}" for i in range(len(rows))] if job else None,
    )


# per kind of subject: messages close to what it serves (so damaged copies get far into the handler)
SEEDS = {
    "embed": st.builds(EmbedRequest, id=st.text(max_size=8), model=st.just(MODEL), texts=short_texts, deadline=soon)
    | VALID[EmbedRequest],
    "tokenize": st.builds(TokenizeRequest, id=st.text(max_size=8), model=st.just(MODEL), texts=short_texts)
    | VALID[TokenizeRequest],
    "tokens": batches_for_the_model() | VALID[TokenChunk],
    "decode": st.builds(
        DecodeRequest,
        id=st.text(max_size=8),
        model=st.just(MODEL),
        ids=st.lists(in_vocab.map(lambda ids: np.array(ids, "<i4")), min_size=1, max_size=3),
    )
    | VALID[DecodeRequest],
    "rerank": st.builds(
        RerankRequest,
        id=st.text(max_size=8),
        model=st.just(MODEL),
        query=st.text(max_size=20),
        texts=short_texts,
        deadline=soon,
        top_n=st.none() | st.integers(1, 3),
    )
    | VALID[RerankRequest],
    "load": st.builds(
        LoadReport,
        id=st.text("abcdef0123", min_size=1, max_size=16),
        model=st.just(MODEL),
        subject=st.text(min_size=1, max_size=30),
        queued_tokens=st.integers(0, 2**64 - 1),
        interval=st.floats(0.01, 60),
        rate=st.floats(0, 1e11),
    )
    | VALID[LoadReport],
}
# what a service may answer besides an error: a worker says which rows it holds (Held) before their
# vectors when the tokenizer asks (online requests)
ANSWERS = {
    "embed": (Held, EmbedResult),
    "tokenize": TokenizeResult,
    "tokens": (Held, EmbedResult),
    "rerank": RerankResult,
    "decode": DecodeResult,
}


def _token_chunk(ids, rows: int = 1, seconds: float = 30, **kw) -> bytes:
    """A token batch of ``rows`` rows over ``ids``, due ``seconds`` from now."""
    ids = np.asarray(ids, "<i4")
    cu = np.linspace(0, len(ids), rows + 1).astype("<i4")
    return encode(TokenChunk(kw.pop("id", "h"), MODEL, 0, rows, ids, cu, time.time() + seconds, **kw))


def _hand_picked(kind: str, max_payload: int) -> list[bytes]:
    """Hand-made hostile payloads for a subject of ``kind``."""
    seed = {
        "embed": encode(EmbedRequest("h", MODEL, ["a text"], time.time() + 30)),
        "tokenize": encode(TokenizeRequest("h", MODEL, ["a text"])),
        "tokens": _token_chunk([101, 2000, 102]),
        "rerank": encode(RerankRequest("h", MODEL, "q", ["a", "b"], time.time() + 30)),
        "decode": encode(DecodeRequest("h", MODEL, [np.array([101, 7592, 102], "<i4")])),
    }[kind]
    body = msgpack.unpackb(seed)
    big = max_payload - 64 * 1024  # under the limit, with room for the envelope
    cases = [
        b"",
        b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00\x8c\x01a\x94.",  # a pickle
        np.random.default_rng(0).bytes(256),
        np.random.default_rng(1).bytes(big),  # random bytes just under the payload limit
        msgpack.packb({**body, "v": VERSION + 1}),
        msgpack.packb({**body, "v": "1"}),
        msgpack.packb({**body, "t": ["embed"]}),
        msgpack.packb({**body, "id": 7}),
        msgpack.packb({**body, "id": "x" * (MAX_ID + 1)}),
        msgpack.packb({**body, "m": ""}),
        msgpack.packb({**body, "m": "someone-else/model"}),
        msgpack.packb({**body, "x": [1, 2]}),
        msgpack.packb({**body, "x": "x" * 1000}),
        msgpack.packb({**body, "dl": float("nan")}),
        msgpack.packb({**body, "dl": 1.0}),
        msgpack.packb({**body, "o": {"dt": ["f4"], "d": -1}}),
        msgpack.packb({**body, "o": {"d": 2**63}}),
        b"\xdd\xff\xff\xff\xff\xc0",  # an array claiming 2**32 - 1 items
        with_raw_field(body, "x", b"\xdd\xff\xff\xff\xff"),
        with_raw_field(body, "id", b"\xdb\xff\xff\xff\xff"),  # a string claiming 4 GB
        with_raw_field(body, "x", deeply_nested(100_000)),
        seed[: len(seed) // 2],
        seed[:-1],
    ]
    if kind == "embed":
        cases += [
            encode(EmbedRequest("h", MODEL, [], time.time() + 30, token_ids=[np.array([101, VOCAB, 102], "<i4")])),
            encode(EmbedRequest("h", MODEL, [], time.time() + 30, token_ids=[np.array([101, -1, 102], "<i4")])),
            encode(EmbedRequest("h", MODEL, [], time.time() + 30, token_ids=[np.array([], "<i4")])),
            msgpack.packb({**body, "x": [], "tk": [b"\x01\x02\x03"]}),
            encode(EmbedRequest("h", MODEL, [], time.time() + 30, token_ids=[np.full(big // 4, VOCAB + 7, "<i4")])),
            encode(EmbedRequest("h", MODEL, ["a"] * 200_000, time.time() - 1)),
            encode(
                EmbedRequest(
                    "h",
                    MODEL,
                    [],
                    time.time() + 30,
                    token_ids=[np.array([101, 102], "<i4")],
                    options=EmbedOptions(dimensions=65536),
                )
            ),
        ]
    if kind == "tokens":
        cases += [
            _token_chunk([101, VOCAB, 102]),
            _token_chunk([101, -5, 102]),
            _token_chunk([101, 2**31 - 1]),
            _token_chunk(np.full(big // 4, VOCAB, "<i4"), rows=4),  # out of the vocabulary, near the limit
            _token_chunk([101] * 300),  # over the model's 256 tokens
            _token_chunk([101, 102], token_types=np.array([0, 5], "<i4")),
            _token_chunk([101, 102], options=EmbedOptions(dimensions=4096)),
            msgpack.packb({**body, "cu": np.array([0, 2**31 - 1, -(2**31), -1, 3], "<i4").tobytes(), "rows": 9}),
            msgpack.packb({**body, "cu": np.array([0, 2, 1, 3], "<i4").tobytes(), "rows": 9}),
            msgpack.packb({**body, "ids": b"\x01\x00\x00"}),
            msgpack.packb({**body, "rows": 2**40}),
            msgpack.packb({**body, "tm": {"x" * 10_000: 1.0}}),
        ]
    if kind == "decode":
        cases += [
            encode(DecodeRequest("h", MODEL, [np.array([101, -1, 102], "<i4")])),
            encode(DecodeRequest("h", MODEL, [np.array([], "<i4")])),
            encode(
                DecodeRequest("h", MODEL, [np.array([101, 2**31 - 1, VOCAB], "<i4")])
            ),  # past the vocabulary: left out
            encode(DecodeRequest("h", MODEL, [np.full(big // 4, 7592, "<i4")])),  # its text would outgrow a message
            msgpack.packb({**body, "tk": [b"\x01\x00\x00"]}),
            msgpack.packb({**body, "tk": b"\x00" * 8}),
            msgpack.packb({**body, "ss": "yes"}),
            with_raw_field(body, "tk", b"\xdd\xff\xff\xff\xff"),
        ]
    if kind == "rerank":
        cases += [
            encode(RerankRequest("h", MODEL, "q", [], time.time() + 30, vectors=np.ones((2, 7), np.float32))),
            msgpack.packb({**body, "x": [], "cv": np.array([1, np.nan], "<f4").tobytes(), "cd": 2}),
            msgpack.packb({**body, "x": [], "cv": b"\x00" * 12, "cd": 2**40}),
            msgpack.packb({**body, "k": 0}),
            encode(RerankRequest("h", MODEL, "q", ["a"], time.time() + 0.001)),
        ]
    return cases


# -- talking to the stack ----------------------------------------------------------------------------


async def _burst(url: str, subject: str, payloads: list[bytes], reply: bool = True) -> list[list]:
    """Publish every payload at once, each with its own reply subject; the replies each got, waiting
    until every payload has one or REPLY_TIMEOUT passed."""
    nc = await nats.connect(url)
    try:
        inbox = nc.new_inbox()
        replies: list[list] = [[] for _ in payloads]
        answered = [asyncio.Event() for _ in payloads]

        async def on_reply(msg) -> None:
            i = int(msg.subject.rsplit(".", 1)[1])
            replies[i].append(msg)
            answered[i].set()

        sub = await nc.subscribe(f"{inbox}.*", cb=on_reply)
        for i, payload in enumerate(payloads):
            await nc.publish(subject, payload, reply=f"{inbox}.{i}" if reply else "")
        await nc.flush()
        if reply:
            try:
                await asyncio.wait_for(asyncio.gather(*(e.wait() for e in answered)), REPLY_TIMEOUT)
            except TimeoutError:
                pass
        await sub.unsubscribe()
        return replies
    finally:
        await nc.close()


def _check_replies(kind: str, payloads: list[bytes], replies: list[list]) -> None:
    for payload, msgs in zip(payloads, replies):
        shown = payload[:120]
        assert msgs, f"no reply within {REPLY_TIMEOUT:g}s to {len(payload)} bytes {shown!r}"
        for msg in msgs:
            assert not (msg.headers and msg.headers.get("Status")), f"status {msg.headers} for {shown!r}"
            answer = decode(msg.data)  # the services only ever send valid protocol
            if isinstance(answer, ErrorReply):
                assert answer.code in REFUSALS, f"{answer} for {shown!r}"
                assert answer.message and len(answer.message) <= 1000 and answer.message.isprintable(), answer
            else:
                assert isinstance(answer, ANSWERS[kind]), f"{answer!r:.200} for {shown!r}"


def _worker_subjects(url: str) -> dict[str, str]:
    """Each live worker's direct subject, from its load reports."""

    async def listen() -> dict[str, str]:
        nc = await nats.connect(url)
        found: dict[str, str] = {}

        async def on_report(msg) -> None:
            report = decode_as(msg.data, LoadReport)
            if not report.leaving:
                found[report.id] = report.subject

        sub = await nc.subscribe(SUBJECTS.load(MODEL), cb=on_report)
        with contextlib.suppress(TimeoutError):  # the caller checks what was found
            await eventually(lambda: len(found) >= 2, 5, "two workers' load reports")
        await sub.unsubscribe()
        await nc.close()
        return found

    return asyncio.run(listen())


def _embed(stack) -> np.ndarray:
    r = httpx.post(f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": CLEAN_TEXTS}, timeout=60)
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


@pytest.fixture(scope="module")
def clean(stack) -> np.ndarray:
    """The stack's vectors for CLEAN_TEXTS before anything hostile was sent."""
    return _embed(stack)


@pytest.fixture(scope="module")
def max_payload(stack) -> int:
    async def ask() -> int:
        nc = await nats.connect(stack.nats_url)
        size = nc.max_payload
        await nc.close()
        return size

    return asyncio.run(ask())


def _assert_still_serving(stack, clean: np.ndarray) -> None:
    """Every process alive and registered; each worker answers on its own subject; the gateway gives
    the vectors it gave before."""
    for name, service in stack.services.items():
        assert service.alive, f"{name} exited:\n{service.log()[-3000:]}"
    # a worker still busy with the burst's batches may miss one ping's window: asked again until every
    # process answers (a dead or wedged one never does), the services' own deaths failing it at once
    expected = {"tokenizer": 1, "worker": 2, "scorer": 1, "gateway": 1}
    wait_until(
        lambda: service_counts(stack.nats_url, list(expected)) == expected,
        30,
        "every process answering pings",
        list(stack.services.values()),
    )
    workers = _worker_subjects(stack.nats_url)
    assert len(workers) == 2, workers
    batch = _token_chunk([101, 7592, 102])
    for subject in workers.values():
        [msgs] = asyncio.run(_burst(stack.nats_url, subject, [batch]))
        assert msgs and isinstance(decode(msgs[0].data), EmbedResult), msgs
    c = cosines(_embed(stack), clean)
    assert c.min() >= COSINE_TOLERANCE, c


# -- the tests ---------------------------------------------------------------------------------------

REQUEST_SUBJECTS = {
    "embed": SUBJECTS.embed(MODEL),
    "tokenize": SUBJECTS.tokenize(MODEL),
    "tokens": SUBJECTS.tokens(MODEL),
    "rerank": SUBJECTS.rerank(MODEL),
    "decode": SUBJECTS.decode(MODEL),
}


@pytest.mark.parametrize("kind", sorted(REQUEST_SUBJECTS))
def test_hand_picked_hostile_requests_are_refused(stack, clean, max_payload, kind):
    payloads = _hand_picked(kind, max_payload)
    started = time.monotonic()
    replies = asyncio.run(_burst(stack.nats_url, REQUEST_SUBJECTS[kind], payloads))
    _check_replies(kind, payloads, replies)
    assert time.monotonic() - started < REPLY_TIMEOUT
    # the same thrown without a reply subject: dropped, nothing breaks
    asyncio.run(_burst(stack.nats_url, REQUEST_SUBJECTS[kind], payloads, reply=False))
    _assert_still_serving(stack, clean)


@pytest.mark.parametrize("kind", sorted(REQUEST_SUBJECTS))
def test_generated_hostile_requests_are_refused(stack, clean, kind):
    @BURSTS
    @given(payloads=st.lists(hostile(SEEDS[kind]), min_size=10, max_size=10))
    def throw(payloads: list[bytes]) -> None:
        _check_replies(kind, payloads, asyncio.run(_burst(stack.nats_url, REQUEST_SUBJECTS[kind], payloads)))

    throw()
    _assert_still_serving(stack, clean)


def test_hostile_batches_on_each_workers_direct_subject(stack, clean, max_payload):
    workers = _worker_subjects(stack.nats_url)
    assert len(workers) == 2

    @BURSTS
    @given(payloads=st.lists(hostile(SEEDS["tokens"]), min_size=10, max_size=10))
    def throw(payloads: list[bytes]) -> None:
        for subject in workers.values():
            _check_replies("tokens", payloads, asyncio.run(_burst(stack.nats_url, subject, payloads)))

    throw()
    for subject in workers.values():
        payloads = _hand_picked("tokens", max_payload)
        _check_replies("tokens", payloads, asyncio.run(_burst(stack.nats_url, subject, payloads)))
    _assert_still_serving(stack, clean)


def test_a_batch_with_the_longest_id_near_the_payload_limit_is_answered_in_full(stack, clean, max_payload):
    """The id and timings a batch carries travel back in every result part: parts are sized with them."""
    rows = max_payload // (384 * 4) + 8  # more rows than one result message holds
    for subject in _worker_subjects(stack.nats_url).values():
        # thousands of rows for one single-threaded worker on a loaded machine: as long a deadline as the
        # wait below, counted from this worker's send (not the first's)
        batch = _token_chunk(
            np.full(rows, 7592, "<i4"),
            rows=rows,
            seconds=120,
            id="x" * MAX_ID,
            timings={f"stage{i}": 1.0 for i in range(MAX_STAGES)},
        )

        async def gather(subject: str, batch: bytes) -> list[EmbedResult]:
            nc = await nats.connect(stack.nats_url)
            parts: list[EmbedResult] = []
            done = asyncio.Event()

            async def on_part(msg) -> None:
                parts.append(decode(msg.data))
                rows_in = sum(p.count for p in parts if isinstance(p, EmbedResult))
                if rows_in >= rows or isinstance(parts[-1], ErrorReply):
                    done.set()

            inbox = nc.new_inbox()
            await nc.subscribe(inbox, cb=on_part)
            await nc.publish(subject, batch, reply=inbox)
            try:
                await asyncio.wait_for(done.wait(), 120)
            finally:
                await nc.close()
            return parts

        parts = asyncio.run(gather(subject, batch))
        assert all(isinstance(p, EmbedResult) for p in parts), parts[-1]
        assert len(parts) >= 2 and sorted(p.start for p in parts)[0] == 0
        vectors = np.concatenate([p.array() for p in sorted(parts, key=lambda p: p.start)])
        assert vectors.shape == (rows, 384) and np.isfinite(vectors).all()
        np.testing.assert_allclose(vectors, vectors[:1].repeat(rows, 0), atol=1e-5)  # one token, one vector
    _assert_still_serving(stack, clean)


async def _bundle_answers(url: str, subject: str, data: bytes, inbox: str, entries: int) -> dict[str, list]:
    """Publish ``data`` with the reply subject ``inbox``.0; what came back for each of ``inbox``.0 ..
    ``entries - 1``, taken out of Replies, within REPLY_TIMEOUT (everything must come on ``inbox``.0)."""
    nc = await nats.connect(url)
    answers: dict[str, list] = {f"{inbox}.{i}": [] for i in range(entries)}
    try:
        sub = await nc.subscribe(f"{inbox}.*")
        await nc.publish(subject, data, reply=f"{inbox}.0")
        deadline = time.monotonic() + REPLY_TIMEOUT
        while any(not got for got in answers.values()) and time.monotonic() < deadline:
            with contextlib.suppress(nats.errors.TimeoutError, asyncio.TimeoutError):
                msg = await sub.next_msg(timeout=max(0.01, deadline - time.monotonic()))
                assert not (msg.headers and msg.headers.get("Status")), msg.headers
                assert msg.subject == f"{inbox}.0", msg.subject  # the one subject a worker may answer on
                message = decode(msg.data)
                if isinstance(message, Replies):
                    for entry_subject, payload in zip(message.subjects, message.messages):
                        answers[entry_subject].append(decode(payload))
                else:
                    answers[msg.subject].append(message)
        return answers
    finally:
        await nc.close()


def test_hostile_batches_in_one_message_are_each_answered_on_its_subject(stack, clean, max_payload):
    """A Requests message of hostile token batches (as a tokenizer bundles them): each entry gets its
    refusal or its vectors, all through the message's reply subject; a malformed Requests is refused."""
    cases = [c for c in _hand_picked("tokens", max_payload) if len(c) < max_payload // 64]
    cases.append(_token_chunk([101, 7592, 102], replies=True))  # one good batch among them
    inbox = "_INBOX.hostile-bundle"
    bundle = encode(Requests([f"{inbox}.{i}" for i in range(len(cases))], [""] * len(cases), cases))
    answers = asyncio.run(_bundle_answers(stack.nats_url, SUBJECTS.tokens(MODEL), bundle, inbox, len(cases)))
    for case, (_subject, got) in zip(cases, answers.items()):
        assert got, f"no answer for {case[:120]!r}"
        for answer in got:
            assert isinstance(answer, (ErrorReply, Held, EmbedResult)), answer
            if isinstance(answer, ErrorReply):
                assert answer.code in REFUSALS and answer.message.isprintable(), answer
    assert isinstance(answers[f"{inbox}.{len(cases) - 1}"][-1], EmbedResult)
    malformed = [
        msgpack.packb(
            {**msgpack.unpackb(bundle), "rp": [f"{inbox}.0", "_INBOX.elsewhere.1"] + [f"{inbox}.9"] * (len(cases) - 2)}
        ),
        msgpack.packb({**msgpack.unpackb(bundle), "ms": cases[:1]}),  # fewer messages than subjects
        encode(Requests([f"{inbox}.1", f"{inbox}.0"], ["", ""], cases[:2])),  # not sent with its first subject
    ]
    for data in malformed:
        got = asyncio.run(_bundle_answers(stack.nats_url, SUBJECTS.tokens(MODEL), data, inbox, 1))[f"{inbox}.0"]
        assert got and all(isinstance(a, ErrorReply) and a.code in REFUSALS for a in got), got
    _assert_still_serving(stack, clean)


async def _routed(stack, subjects: list[str]) -> dict[str, int]:
    """Token batches seen on each of ``subjects`` while the gateway serves one request."""
    nc = await nats.connect(stack.nats_url)
    seen = dict.fromkeys(subjects, 0)

    async def on_batch(msg) -> None:
        seen[msg.subject] += 1

    try:
        for subject in subjects:
            await nc.subscribe(subject, cb=on_batch)  # beside the workers: each sees every message
        await nc.flush()
        async with httpx.AsyncClient(timeout=60) as client:
            r = await client.post(f"{stack.base_url}/v1/embeddings", json={"model": MODEL, "input": CLEAN_TEXTS * 20})
        assert r.status_code == 200, r.text
        await nc.flush()
    finally:
        await nc.close()
    return seen


def test_hostile_load_reports_do_not_misroute(stack, clean):
    """Reports that name a subject no worker serves (or are not reports at all) are ignored: with fake
    'idle, infinitely fast' workers announced, token batches still go to the real workers' subjects."""
    elsewhere = ["somewhere.else", SUBJECTS.worker(MODEL, "not-this-one")]
    fakes = [encode(LoadReport(f"fake{i}", MODEL, subject, 0, 60.0, rate=1e11)) for i, subject in enumerate(elsewhere)]
    fakes.append(encode(LoadReport("fake-wild", MODEL, "wild.*", 0, 60.0, rate=1e11)))
    asyncio.run(_burst(stack.nats_url, SUBJECTS.load(MODEL), fakes, reply=False))

    @BURSTS
    @given(payloads=st.lists(hostile(SEEDS["load"]), min_size=10, max_size=10))
    def throw(payloads: list[bytes]) -> None:
        asyncio.run(_burst(stack.nats_url, SUBJECTS.load(MODEL), payloads, reply=False))
        asyncio.run(_burst(stack.nats_url, SUBJECTS.leaving(), payloads, reply=False))

    throw()
    asyncio.run(_burst(stack.nats_url, SUBJECTS.leaving(), fakes, reply=False))  # the gateway's fleet watch
    workers = list(_worker_subjects(stack.nats_url).values())
    seen = asyncio.run(_routed(stack, workers + elsewhere))
    assert sum(seen[s] for s in workers) > 0 and all(seen[s] == 0 for s in elsewhere), seen
    _assert_still_serving(stack, clean)


def test_discovery_and_advisory_subjects_shrug_off_garbage(stack, clean):
    names = stream_names(SUBJECTS)
    token = MODEL.replace("/", "_")
    advisories = [
        f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{names['jobs']}.tokenizers-{token}",
        f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{names['bulk']}.workers-{token}",
    ]
    garbage = [
        b"",
        b"\xff\xfe",
        b"[" * 100_000,
        json.dumps({"stream_seq": "1e9999"}).encode(),
        json.dumps({"stream_seq": 10**12, "deliveries": "many"}).encode(),
        b"{}",
    ]
    for subject in advisories:
        asyncio.run(_burst(stack.nats_url, subject, garbage, reply=False))
    for name in SERVICE_NAMES.values():
        for verb in ("PING", "INFO", "STATS"):
            [msgs] = asyncio.run(_burst(stack.nats_url, f"$SRV.{verb}.{name}", [b"\xc1" * 64]))
            assert msgs and all(isinstance(json.loads(m.data), dict) for m in msgs)
    _assert_still_serving(stack, clean)


def _refused_as(kind: type, job: str):
    """Whether a stage must give a bulk payload up whatever its content, as a letter of ``job``: not a
    message of ``kind``, a token batch of no job, a job batch of another model. (A message that does
    decode, of another job, is that job's letter: left out.)"""

    def refused(data: bytes) -> bool:
        try:
            msg = decode_as(data, kind)
        except ProtocolError:
            return True
        if (msg.job if isinstance(msg, TokenChunk) else msg.id) not in (None, job):
            return False
        return msg.job is None if isinstance(msg, TokenChunk) else msg.model != MODEL

    return refused


async def _dead_letters(url: str, subject: str, want: int, timeout: float = 90.0) -> list:
    """The dead letters on ``subject`` once there are ``want`` of them (or the timeout passed)."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    stream = stream_names(SUBJECTS)["dead"]
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = await js.stream_info(stream, subjects_filter=subject)
            if (info.state.subjects or {}).get(subject, 0) >= want:
                break
            await asyncio.sleep(0.2)
        sub = await js.subscribe(subject, stream=stream, ordered_consumer=True)
        letters = []
        try:
            while True:
                letters.append(await sub.next_msg(timeout=2))
        except (TimeoutError, nats.errors.TimeoutError):
            pass
        await sub.unsubscribe()
        return letters
    finally:
        await nc.close()


async def _publish_bulk(url: str, subject: str, payloads: list[bytes], job: str, numbers: int) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for i, payload in enumerate(payloads):
            await js.publish(subject, payload, headers={"Nats-Msg-Id": ":".join([job, str(i), *["0"] * (numbers - 1)])})
    finally:
        await nc.close()


BULK = {
    # stream subject, message type, numbers ending a message id, what may not become a dead letter
    "jobs": (SUBJECTS.jobs(MODEL), JobBatch, 1),
    "bulk": (SUBJECTS.bulk(MODEL), TokenChunk, 2),
}


@pytest.mark.parametrize("stage", sorted(BULK))
def test_hostile_bulk_messages_become_dead_letters(stack, clean, max_payload, stage):
    subject, kind, numbers = BULK[stage]
    job = f"hostile-{stage}-{uuid.uuid4().hex[:8]}"
    big = np.random.default_rng(2).bytes(max_payload - 512)  # alone it fits; with dead-letter headers it would not
    hand = [b"", big, msgpack.packb({"v": 1, "t": kind.TYPE, "id": job}), b"\xdd\xff\xff\xff\xff", deeply_nested(5000)]
    if kind is JobBatch:
        hand += [
            encode(JobBatch(job, 0, "someone-else/model", ["d0"], ["text"])),
            encode(JobBatch(job, 0, MODEL, ["d0"], ["text"], EmbedOptions(prompt_name="nope"))),
        ]
    else:
        hand += [
            _token_chunk([101, VOCAB, 102], job=job, doc_ids=["d0"]),
            _token_chunk([101, 102]),  # no job: not bulk work
            _token_chunk([101] * 300, job=job, doc_ids=["d0"]),
        ]

    generated: list[bytes] = []

    seed = VALID[kind] if kind is JobBatch else token_chunks(job=True)

    @settings(max_examples=2, deadline=None, suppress_health_check=[*SLOW_OK, HealthCheck.filter_too_much])
    @given(payloads=st.lists(hostile(seed).filter(_refused_as(kind, job)), min_size=10, max_size=10))
    def draw(payloads: list[bytes]) -> None:
        generated.extend(payloads)

    draw()
    payloads = hand + generated
    asyncio.run(_publish_bulk(stack.nats_url, subject, payloads, job, numbers))
    letters = asyncio.run(_dead_letters(stack.nats_url, SUBJECTS.dead(job), len(payloads)))
    assert len(letters) == len(payloads), f"{len(letters)} dead letters for {len(payloads)} hostile batches"
    by_size = {len(p) for p in payloads}
    for letter in letters:
        cut = letter.headers.get(TRUNCATED)
        assert len(letter.data) in by_size or (cut and int(cut) == len(big)), letter.headers
    assert any(letter.headers.get(TRUNCATED) for letter in letters)  # the big one, kept cut
    _assert_still_serving(stack, clean)
