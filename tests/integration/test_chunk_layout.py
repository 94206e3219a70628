"""A tokenizer process over a real nats-server answers chunk layouts (EmbedClient.chunk): exactly the cuts
services/tokenizer/chunking.py makes of the same texts in-process, and refusals in the protocol's words
with their codes and rows: a window over the model's room (which a prompt makes smaller), and a
request cut into more chunks than --max-chunks; and hostile payloads refused, the tokenizer serving on."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import msgpack
import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedfleet.services.tokenizer.chunking import cut
from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.nats.embed_client import EmbedClient
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import ChunkLayout, ChunkRequest, EmbedOptions, ErrorReply, decode, encode
from embedfleet.shared.text_chunks import ChunkSpec
from tests.shared.protocol.test_fuzz import VALID, hostile
from tests.support.corpus import mixed_texts
from tests.support.procs import Service, count_services, wait_until

pytestmark = pytest.mark.integration

PREFIX = "chunklayout"  # a subject prefix of its own: no other tokenizer of the session answers
MODEL = "all-MiniLM-L6-v2"
MAX_CHUNKS = 2048
PROMPTS = {"query": "query: "}  # 2 tokens: "query", ":"
TIMEOUT = 30.0  # seconds a tokenizer may take to answer on a loaded two-core machine

T = TypeVar("T")


@pytest.fixture(scope="module")
def tokenizer(nats_url: str, tmp_path_factory) -> Iterator[Service]:
    args = [
        "--nats",
        nats_url,
        "--subject-prefix",
        PREFIX,
        "--max-chunks",
        str(MAX_CHUNKS),
        "--prompts",
        json.dumps(PROMPTS),
    ]
    service = Service("tokenizer", args, tmp_path_factory.mktemp("chunk-logs"))
    try:
        wait_until(lambda: count_services(nats_url, "tokenizer", prefix=PREFIX) == 1, 120, "the tokenizer", [service])
        yield service
    finally:
        service.stop()


def _with_client(nats_url: str, call: Callable[[EmbedClient], Awaitable[T]]) -> T:
    async def run() -> T:
        nc = await nats.connect(nats_url)
        try:
            return await call(EmbedClient(nc, Subjects(PREFIX)))
        finally:
            await nc.close()

    return asyncio.run(run())


def _chunk(nats_url: str, texts: list[str], spec: ChunkSpec, options: EmbedOptions = EmbedOptions()) -> ChunkLayout:
    return _with_client(nats_url, lambda client: client.chunk(MODEL, texts, spec, options, TIMEOUT))


def _refusal(nats_url: str, texts: list[str], spec: ChunkSpec, options: EmbedOptions = EmbedOptions()) -> ServiceError:
    with pytest.raises(ServiceError) as err:
        _chunk(nats_url, texts, spec, options)
    return err.value


@pytest.fixture(scope="module")
def texts() -> list[str]:
    docs = mixed_texts(48)
    long = [t for t in docs if len(t) > 3000][:2]  # whole help topics, thousands of tokens
    return [*long, *docs[:6], "", "  \n ", "Crème brûlée. 我爱北京天安门。Line\n\nbreaks\tand tabs."]


@pytest.mark.parametrize(
    "spec",
    [ChunkSpec(254, 32), ChunkSpec(100, 0, "sentence"), ChunkSpec(64, 48), ChunkSpec(16, 4)],
    ids=["token-254-32", "sentence-100-0", "token-64-48", "token-16-4"],
)
def test_the_layout_is_the_cut_made_in_process(tokenizer, nats_url, model_info, texts, spec):
    whole = TextEncoder(model_info).whole_text_tokenizer()
    encodings = [whole.encode(t, add_special_tokens=False) for t in texts]
    expected = [cut(t, e, spec, whole) for t, e in zip(texts, encodings)]
    assert sum(map(len, expected)) <= MAX_CHUNKS and max(map(len, expected)) >= 3  # long texts are cut
    started = time.monotonic()
    layout = _chunk(nats_url, texts, spec)
    assert time.monotonic() - started < TIMEOUT
    assert layout.chunks() == expected
    assert layout.tokens.tolist() == [len(c.ids) for c in expected]


def test_a_window_over_the_models_room_is_refused(tokenizer, nats_url):
    assert _chunk(nats_url, ["a text"], ChunkSpec(254)).counts.tolist() == [1]  # 256 less [CLS] and [SEP]
    error = _refusal(nats_url, ["a text"], ChunkSpec(255))
    assert (error.code, error.row) == (ErrorCode.INVALID_REQUEST, None)
    assert error.message == (
        "chunking.size is 255; this model holds at most 254 tokens of text a chunk (its limit, "
        "less its special tokens and the prompt)"
    )


def test_a_prompt_leaves_a_chunk_less_room(tokenizer, nats_url):
    query = EmbedOptions(input_type="query")
    assert _chunk(nats_url, ["a text"], ChunkSpec(252), query).counts.tolist() == [1]
    error = _refusal(nats_url, ["a text"], ChunkSpec(253), query)
    assert (error.code, error.row) == (ErrorCode.INVALID_REQUEST, None)
    assert error.message.startswith("chunking.size is 253; this model holds at most 252 tokens of text a chunk")
    error = _refusal(nats_url, ["a text"], ChunkSpec(8), EmbedOptions(prompt_name="passage"))
    assert (error.code, error.message) == (
        ErrorCode.INVALID_REQUEST,
        "the model has no prompt 'passage' (its prompts: query)",
    )


def test_more_chunks_than_max_chunks_are_refused_at_the_input_that_passes_them(tokenizer, nats_url):
    words = " ".join(["word"] * 8000)  # 8,000 tokens: 1,000 chunks of 8
    error = _refusal(nats_url, ["short", words, words, words], ChunkSpec(8))  # 1, 1001, 2001, 3001 chunks so far
    assert (error.code, error.row) == (ErrorCode.INPUT_TOO_LONG, 3)
    assert error.text() == (
        f"input 3 takes the request past {MAX_CHUNKS} chunks, the most one may be cut into: its texts up to it "
        "make 3001 (send fewer or shorter texts, or a larger chunking.size)"
    )
    assert _chunk(nats_url, ["short", words, words], ChunkSpec(8)).counts.tolist() == [1, 1000, 1000]


def test_the_refusal_travels_as_an_error_reply_with_its_row(tokenizer, nats_url):
    """On the wire, as any NATS client sees it: an ErrorReply with the code and the row."""

    async def ask() -> bytes:
        nc = await nats.connect(nats_url)
        try:
            request = ChunkRequest("raw-1", MODEL, ["a", " ".join(["word"] * 20_000)], ChunkSpec(8))
            return (await nc.request(Subjects(PREFIX).chunk(MODEL), encode(request), timeout=TIMEOUT)).data
        finally:
            await nc.close()

    reply = decode(asyncio.run(ask()))
    assert isinstance(reply, ErrorReply)
    assert (reply.id, reply.code, reply.row) == ("raw-1", ErrorCode.INPUT_TOO_LONG, 1)
    assert msgpack.unpackb(encode(reply))["row"] == 1
    assert "Traceback" not in tokenizer.log()  # every refusal above was answered, none raised


# requests close to valid ones (so damaged copies get far into the handler), and the fuzz suite's
SEEDS = (
    st.builds(
        ChunkRequest,
        id=st.text(max_size=8),
        model=st.just(MODEL),
        texts=st.lists(st.text(max_size=60), max_size=4),
        spec=st.builds(ChunkSpec, st.integers(1, 300)),
        input_type=st.none() | st.just("query"),
    )
    | VALID[ChunkRequest]
)
REFUSALS = {ErrorCode.INVALID_REQUEST, ErrorCode.INPUT_TOO_LONG, ErrorCode.MODEL_NOT_FOUND}


async def _ask_each(nats_url: str, payloads: list[bytes]) -> list[bytes]:
    nc = await nats.connect(nats_url)
    try:
        subject = Subjects(PREFIX).chunk(MODEL)
        return [(await nc.request(subject, payload, timeout=TIMEOUT)).data for payload in payloads]
    finally:
        await nc.close()


def test_hostile_requests_are_refused_and_the_tokenizer_serves_on(tokenizer, nats_url):
    @settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(payloads=st.lists(hostile(SEEDS), min_size=10, max_size=10))
    def throw(payloads: list[bytes]) -> None:
        for payload, data in zip(payloads, asyncio.run(_ask_each(nats_url, payloads))):
            answer = decode(data)  # the tokenizer only ever answers valid protocol
            if isinstance(answer, ErrorReply):
                assert answer.code in REFUSALS and 0 < len(answer.message) <= 1000, (answer, payload[:120])
            else:
                assert isinstance(answer, ChunkLayout), (answer, payload[:120])

    throw()
    assert _chunk(nats_url, ["still serving"], ChunkSpec(8)).counts.tolist() == [1]
    assert tokenizer.alive and "Traceback" not in tokenizer.log()
