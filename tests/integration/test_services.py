"""Services on the wire: untrusted messages get error replies, the scorer ranks, services stay up."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import msgpack
import nats
import numpy as np
import pytest

from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import (
    EmbedOptions,
    EmbedRequest,
    EmbedResult,
    ErrorReply,
    Held,
    Replies,
    RerankRequest,
    RerankResult,
    TokenChunk,
    decode,
    encode,
)

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"
SUBJECTS = Subjects()


async def _request(url: str, subject: str, payload: bytes, timeout: float = 30):
    nc = await nats.connect(url)
    try:
        msg = await nc.request(subject, payload, timeout=timeout)
        return decode(msg.data)
    finally:
        await nc.close()


@pytest.mark.parametrize(
    "payload, code",
    [
        (b"\x80\x04\x95 pickled?", ErrorCode.INVALID_REQUEST),
        (msgpack.packb({"v": 9, "t": "embed"}), ErrorCode.INVALID_REQUEST),
        (
            msgpack.packb({"v": 2, "t": "embed", "id": "x", "m": MODEL, "x": [], "dl": time.time() + 9}),
            ErrorCode.INVALID_REQUEST,
        ),
        (msgpack.packb({"v": 2, "t": "embed", "id": "x", "m": MODEL, "x": ["a"], "dl": 1.0}), ErrorCode.TIMEOUT),
    ],
    ids=["pickle", "version-9", "no-texts", "past-deadline"],  # the payloads hold the time: xdist needs fixed ids
)
def test_tokenizer_answers_bad_messages_with_errors(stack, payload, code):
    reply = asyncio.run(_request(stack.nats_url, SUBJECTS.embed(MODEL), payload))
    assert isinstance(reply, ErrorReply) and reply.code is code
    assert stack.services["tokenizer"].alive


def _token_batch(ids: list[int], deadline: float | None = None) -> bytes:
    return encode(
        TokenChunk(
            id="t",
            model=MODEL,
            start=0,
            total=1,
            input_ids=np.array(ids, np.int32),
            cu_seqlens=np.array([0, len(ids)], np.int32),
            deadline=deadline or time.time() + 30,
        )
    )


@pytest.mark.parametrize(
    "payload, code",
    [
        (b"garbage", ErrorCode.INVALID_TOKENS),
        (_token_batch([101, 999999, 102]), ErrorCode.INVALID_TOKENS),
        (_token_batch([101] * 300), ErrorCode.INPUT_TOO_LONG),
        (_token_batch([101, 102], deadline=1.0), ErrorCode.TIMEOUT),
    ],
    ids=["garbage", "outside-vocabulary", "over-limit", "past-deadline"],
)
def test_worker_answers_bad_batches_with_errors(stack, payload, code):
    reply = asyncio.run(_request(stack.nats_url, SUBJECTS.tokens(MODEL), payload))
    assert isinstance(reply, ErrorReply) and reply.code is code, reply
    assert stack.services["worker-1"].alive and stack.services["worker-2"].alive


def test_worker_errors_name_the_requests_row(stack):
    """A batch of rows 5 and 6 of a request: the request's row at fault is named, as the wire carries it."""
    bad_token = TokenChunk(
        id="t",
        model=MODEL,
        start=5,
        total=8,
        input_ids=np.array([101, 102, 101, 999999, 102], np.int32),
        cu_seqlens=np.array([0, 2, 5], np.int32),
        deadline=time.time() + 30,
    )
    reply = asyncio.run(_request(stack.nats_url, SUBJECTS.tokens(MODEL), encode(bad_token)))
    assert isinstance(reply, ErrorReply) and (reply.code, reply.row) == (ErrorCode.INVALID_TOKENS, 6), reply
    assert reply.message == "has token ids outside the vocabulary [0, 30522)"
    too_long = TokenChunk(
        id="t",
        model=MODEL,
        start=3,
        total=8,
        input_ids=np.full(302, 101, np.int32),
        cu_seqlens=np.array([0, 300, 302], np.int32),
        deadline=time.time() + 30,
    )
    reply = asyncio.run(_request(stack.nats_url, SUBJECTS.tokens(MODEL), encode(too_long)))
    assert isinstance(reply, ErrorReply) and (reply.code, reply.row) == (ErrorCode.INPUT_TOO_LONG, 3), reply
    assert reply.message == "has 300 tokens; the model's limit is 256"


async def _replies(url: str, request: EmbedRequest, timeout: float = 30) -> list:
    """Every reply to ``request`` until its rows' results are all in (or ``timeout``), in order."""
    nc = await nats.connect(url)
    try:
        inbox, got, rows = nc.new_inbox(), [], 0
        sub = await nc.subscribe(inbox)
        await nc.publish(SUBJECTS.embed(MODEL), encode(request), reply=inbox)
        deadline = time.monotonic() + timeout
        while rows < request.count and time.monotonic() < deadline:
            reply = decode((await sub.next_msg(timeout=deadline - time.monotonic())).data)
            got.append(reply)
            rows += reply.count if isinstance(reply, EmbedResult) else 0
        with_a_moment = time.monotonic() + 0.5  # nothing more comes after the results
        while time.monotonic() < with_a_moment:
            try:
                got.append(decode((await sub.next_msg(timeout=with_a_moment - time.monotonic())).data))
            except (TimeoutError, nats.errors.TimeoutError):
                break
        return got
    finally:
        await nc.close()


@pytest.mark.parametrize("asks", [False, True], ids=["does-not-ask", "asks-for-held"])
def test_workers_say_which_rows_they_hold_only_to_a_requester_that_asks(stack, asks):
    """Held replies cost messages: only a request that asks (`hd`, while several workers serve its
    model) is told which worker holds which rows."""
    request = EmbedRequest(
        id=f"held-{asks}", model=MODEL, texts=["one", "two", "three"], deadline=time.time() + 30, held=asks
    )
    replies = asyncio.run(_replies(stack.nats_url, request))
    results = [r for r in replies if isinstance(r, EmbedResult)]
    assert sum(r.count for r in results) == 3, replies
    held = [r for r in replies if isinstance(r, Held)]
    assert [type(r) for r in replies if not isinstance(r, (EmbedResult, Held))] == []
    if asks:
        assert held and replies.index(held[0]) < replies.index(results[0]), replies
        assert sum(h.rows for h in held) >= 3
    else:
        assert held == [], replies


def test_tokenizer_errors_name_the_row(stack):
    ids = [np.array([101, 102], np.int32)] * 2 + [np.array([101, 999999], np.int32)]
    request = EmbedRequest(id="e", model=MODEL, texts=[], deadline=time.time() + 30, token_ids=ids)
    reply = asyncio.run(_request(stack.nats_url, SUBJECTS.embed(MODEL), encode(request)))
    assert isinstance(reply, ErrorReply) and (reply.code, reply.row) == (ErrorCode.INVALID_TOKENS, 2), reply
    assert reply.message == "has token ids outside the vocabulary [0, 30522)"
    request = EmbedRequest(
        id="e",
        model=MODEL,
        texts=["short", "word " * 300],
        deadline=time.time() + 30,
        options=EmbedOptions(truncate=False),
    )
    reply = asyncio.run(_request(stack.nats_url, SUBJECTS.embed(MODEL), encode(request)))
    assert isinstance(reply, ErrorReply) and (reply.code, reply.row) == (ErrorCode.INPUT_TOO_LONG, 1), reply
    assert reply.message == "has 302 tokens; the model's limit is 256 (send truncate=true to cut it)"


def test_scorer_ranks_like_reference_cosine(stack, reference):
    query = "How do I handle exceptions in Python?"
    texts = [
        "The try statement specifies exception handlers and cleanup code for a group of statements.",
        "Slicing a sequence selects a range of items.",
        "The raise statement throws an exception; except clauses catch it.",
        "Integers have unlimited precision.",
        "A for loop iterates over the items of any sequence.",
    ]
    request = RerankRequest(id="r", model=MODEL, query=query, texts=texts, deadline=time.time() + 30, top_n=3)
    reply = asyncio.run(_request(stack.nats_url, SUBJECTS.rerank(MODEL), encode(request)))
    assert isinstance(reply, RerankResult)
    ref = reference.encode([query, *texts])
    ref_scores = ref[1:] @ ref[0]
    order = np.argsort(-ref_scores)[:3]
    assert reply.indices.tolist() == order.tolist()
    np.testing.assert_allclose(reply.scores, ref_scores[order], atol=1e-4)


def test_scorer_empty_candidates(stack):
    request = RerankRequest(id="e", model=MODEL, query="q", texts=[], deadline=time.time() + 30)
    reply = asyncio.run(_request(stack.nats_url, SUBJECTS.rerank(MODEL), encode(request)))
    assert isinstance(reply, RerankResult) and len(reply.indices) == 0


def test_scorer_takes_candidate_vectors_returns_texts_and_honours_the_deadline(stack, reference):
    query = "How do I handle exceptions in Python?"
    texts = [
        "The raise statement throws an exception.",
        "Integers have unlimited precision.",
        "try and except catch errors.",
    ]
    vectors = reference.encode(texts)  # already embedded by someone: not embedded again
    request = RerankRequest(id="v", model=MODEL, query=query, texts=[], deadline=time.time() + 30, vectors=vectors)
    reply = asyncio.run(_request(stack.nats_url, SUBJECTS.rerank(MODEL), encode(request)))
    assert isinstance(reply, RerankResult), reply
    ref = reference.encode([query])[0]
    want = vectors @ ref / np.linalg.norm(vectors, axis=1) / np.linalg.norm(ref)
    assert reply.indices.tolist() == np.argsort(-want).tolist()
    np.testing.assert_allclose(reply.scores, np.sort(want)[::-1], atol=1e-4)

    wrong = RerankRequest(
        id="w", model=MODEL, query=query, texts=[], deadline=time.time() + 30, vectors=vectors[:, :10]
    )
    reply = asyncio.run(_request(stack.nats_url, SUBJECTS.rerank(MODEL), encode(wrong)))
    assert isinstance(reply, ErrorReply) and "10 dimensions" in reply.message

    with_texts = RerankRequest(
        id="t", model=MODEL, query=query, texts=texts, deadline=time.time() + 30, top_n=2, return_text=True
    )
    reply = asyncio.run(_request(stack.nats_url, SUBJECTS.rerank(MODEL), encode(with_texts)))
    assert reply.texts == [texts[i] for i in reply.indices.tolist()] and len(reply.texts) == 2

    late = RerankRequest(id="l", model=MODEL, query=query, texts=texts * 50, deadline=time.time() + 0.02)
    started = time.monotonic()
    reply = asyncio.run(_request(stack.nats_url, SUBJECTS.rerank(MODEL), encode(late)))
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.TIMEOUT, reply
    assert time.monotonic() - started < 5  # the whole rerank is bounded by the deadline


async def _together(url: str, requests: list[EmbedRequest], timeout: float = 60) -> dict[str, list]:
    """``requests`` published in one go (one socket write: the tokenizer takes them as one group);
    each request id -> the replies its own inbox got, until its rows are in or an error came."""
    nc = await nats.connect(url)
    try:
        subs = {r.id: await nc.subscribe(nc.new_inbox()) for r in requests}
        for r in requests:
            await nc.publish(SUBJECTS.embed(r.model), encode(r), reply=subs[r.id].subject)
        got: dict[str, list] = {}
        deadline = time.monotonic() + timeout
        for r in requests:
            got[r.id], rows = [], 0
            while rows < r.count and not any(isinstance(x, ErrorReply) for x in got[r.id]):
                reply = decode((await subs[r.id].next_msg(timeout=deadline - time.monotonic())).data)
                got[r.id].append(reply)
                rows += reply.count if isinstance(reply, EmbedResult) else 0
        return got
    finally:
        await nc.close()


def test_requests_arriving_together_are_each_answered_as_alone(stack):
    """A group taken at once: each request keeps its rows, its options and its own error (its row
    counted within itself, though tokenized with others)."""
    dl = time.time() + 60
    ids = [np.array([101, 2000, 102], np.int32), np.array([101, 999999], np.int32)]
    requests = [
        EmbedRequest(id="g-texts", model=MODEL, texts=["one", "two", "three"], deadline=dl),
        EmbedRequest(id="g-late", model=MODEL, texts=["late"], deadline=1.0),
        EmbedRequest(
            id="g-strict", model=MODEL, texts=["a", "b", "c"], deadline=dl, options=EmbedOptions(truncate=False)
        ),
        EmbedRequest(
            id="g-long", model=MODEL, texts=["short", "word " * 300], deadline=dl, options=EmbedOptions(truncate=False)
        ),
        EmbedRequest(
            id="g-left",
            model=MODEL,
            texts=["word " * 300, "x"],
            deadline=dl,
            options=EmbedOptions(truncation_direction="left"),
        ),
        EmbedRequest(id="g-ids", model=MODEL, texts=[], deadline=dl, token_ids=ids),
        EmbedRequest(id="g-pairs", model=MODEL, texts=[], deadline=dl, pairs=[("q", "d"), ("q2", "d2")]),
        EmbedRequest(id="g-one", model=MODEL, texts=["alone"], deadline=dl),
    ]
    got = asyncio.run(_together(stack.nats_url, requests))
    errors = {rid: (r[-1].code, r[-1].row, r[-1].id) for rid, r in got.items() if isinstance(r[-1], ErrorReply)}
    assert errors == {
        "g-late": (ErrorCode.TIMEOUT, None, "g-late"),
        "g-long": (ErrorCode.INPUT_TOO_LONG, 1, "g-long"),
        "g-ids": (ErrorCode.INVALID_TOKENS, 1, "g-ids"),
    }, got
    for rid, count in (("g-texts", 3), ("g-strict", 3), ("g-left", 2), ("g-pairs", 2), ("g-one", 1)):
        results = [r for r in got[rid] if isinstance(r, EmbedResult)]
        assert all(r.id == rid for r in results) and len(results) == len(got[rid]), got[rid]
        starts = sorted((r.start, r.count) for r in results)
        assert sum(c for _, c in starts) == count and [s for s, _ in starts] == [
            sum(c for _, c in starts[:i]) for i in range(len(starts))
        ], starts


async def _gather_replies(url: str, requests: list[EmbedRequest], timeout: float = 60) -> tuple[dict[str, list], int]:
    """``requests`` published in one go, each saying it reads Replies: request id -> the replies it got
    (alone on its own subject or inside a Replies), and how many Replies messages came."""
    nc = await nats.connect(url)
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(f"{inbox}.*")
        for r in requests:
            await nc.publish(SUBJECTS.embed(r.model), encode(replace(r, replies=True)), reply=f"{inbox}.{r.id}")
        got: dict[str, list] = {r.id: [] for r in requests}
        rows = {r.id: 0 for r in requests}
        bundles = 0
        deadline = time.monotonic() + timeout
        while any(rows[r.id] < r.count for r in requests):
            msg = await sub.next_msg(timeout=deadline - time.monotonic())
            reply = decode(msg.data)
            if isinstance(reply, Replies):
                bundles += 1
                parts = [(s.rsplit(".", 1)[-1], decode(m)) for s, m in zip(reply.subjects, reply.messages)]
            else:
                parts = [(msg.subject.rsplit(".", 1)[-1], reply)]
            for rid, part in parts:
                assert isinstance(part, EmbedResult) and part.id == rid, part
                got[rid].append(part)
                rows[rid] += part.count
        return got, bundles
    finally:
        await nc.close()


def test_a_batch_s_results_for_one_requester_come_as_one_replies_message(stack):
    """Requests that say they read Replies get a batch's results in one message; each result is the one
    the request gets alone on its reply subject (a requester of an earlier release)."""
    dl = time.time() + 60
    requests = [
        EmbedRequest(id=f"b{i}", model=MODEL, texts=[f"query number {i}", "and a second input"], deadline=dl)
        for i in range(8)
    ]
    alone = asyncio.run(_together(stack.nats_url, requests))
    for _ in range(5):  # the 8 requests nearly always share a batch; one Replies is enough
        got, bundles = asyncio.run(_gather_replies(stack.nats_url, requests))
        if bundles:
            break
    assert bundles >= 1
    for r in requests:
        ours = np.concatenate([p.array() for p in sorted(got[r.id], key=lambda p: p.start)])
        theirs = np.concatenate([p.array() for p in sorted(alone[r.id], key=lambda p: p.start)])
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)
    got, bundles = asyncio.run(_gather_replies(stack.nats_url, requests[:1]))  # a lone result goes alone
    assert bundles == 0 and sum(p.count for p in got["b0"]) == 2
