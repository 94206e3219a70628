"""A chunked request's work is bounded before it is allocated, on a real tokenizer process: its memory
(peak RSS, from /proc/<pid>/status) stays under 1.2x its idle RSS plus MARGIN whatever one request
holds, and the request is refused quickly with the limit named. The two cases that once took the
tokenizer from 344 MB to 1.6-1.8 GB for 20 s: 127 inputs of 65,000 characters asked in chunks of one
token (refused at the first input: it alone passes --max-chunks, and nothing after it is tokenized),
and a bulk job's document of 7.5 MB in chunks of one token (given up unread: over
--max-document-chars, a dead letter naming it)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from embedfleet.shared.config.registry import default
from embedfleet.shared.errors import ErrorCode, ServiceError
from embedfleet.shared.jobs.bucket import read_state
from embedfleet.shared.jobs.progress import Rows
from embedfleet.shared.jobs.publish import submit
from embedfleet.shared.jobs.streams import ensure_streams
from embedfleet.shared.nats.embed_client import EmbedClient
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import EmbedOptions
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking
from tests.support.corpus import mixed_texts
from tests.support.procs import Service, count_services, wait_until

pytestmark = pytest.mark.integration

PREFIX = "boundedwork"  # a subject prefix of its own: no other tokenizer of the session answers
MODEL = "all-MiniLM-L6-v2"
MARGIN = 128 << 20  # bytes over 1.2x idle RSS: a message of up to 8 MB in its few copies, one group's encodings
FAST = 5.0  # seconds a refusal may take on a loaded two-core machine (the unbounded cut took over 20)
MAX_CHUNKS = default("max_chunks")
MAX_CHARS = default("max_document_chars")
RESULT_BUDGET = 300_000  # bytes of results a job may store: two batches of the budget test's, not three


def _status(pid: int, field: str) -> int:
    """A /proc/<pid>/status memory field (VmRSS, VmHWM) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


class PeakRss:
    """The highest RSS of process ``pid`` while in the ``with`` block: the kernel's own peak (VmHWM, reset
    on entry through clear_refs where allowed) and the RSS read every 5 ms, whichever is higher."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._done = pid, 0, threading.Event()

    def __enter__(self) -> PeakRss:
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
            self._hwm = True
        except OSError:
            self._hwm = False
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, _status(self.pid, "VmRSS"))
            self._done.wait(0.005)

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        if self._hwm:
            self.peak = max(self.peak, _status(self.pid, "VmHWM"))


def _text(chars: int) -> str:
    """Prose of ``chars`` characters (help topics, repeated)."""
    corpus = " ".join(mixed_texts(200))
    return (corpus * (chars // len(corpus) + 1))[:chars]


async def _connected(nats_url: str):
    return await nats.connect(nats_url, max_reconnect_attempts=0)


@pytest.fixture(scope="module")
def tokenizer(nats_url: str, tmp_path_factory) -> Iterator[tuple[Service, int]]:
    """The tokenizer process, with its idle RSS once it has cut a text and a job batch (bytes)."""

    async def streams() -> None:
        nc = await _connected(nats_url)
        try:
            await ensure_streams(nc.jetstream(), Subjects(PREFIX))
        finally:
            await nc.close()

    asyncio.run(streams())
    args = ["--nats", nats_url, "--subject-prefix", PREFIX, "--job-max-result-bytes", str(RESULT_BUDGET)]
    service = Service("tokenizer", args, tmp_path_factory.mktemp("bw"))
    try:
        wait_until(lambda: count_services(nats_url, "tokenizer", prefix=PREFIX) == 1, 120, "the tokenizer", [service])
        layout = asyncio.run(_chunk(nats_url, [_text(5000)] * 4, ChunkSpec(64)))
        assert layout.counts.min() > 10  # cut: the encoder and its copy are warm
        state = asyncio.run(_job(nats_url, "warm", [("w", _text(5000))], JobChunking(ChunkSpec(64))))
        assert state.chunks > 10 and state.failed == 0, state
        time.sleep(0.5)
        yield service, _status(service.proc.pid, "VmRSS")
    finally:
        service.stop()


async def _chunk(nats_url: str, texts: list[str], spec: ChunkSpec):
    nc = await _connected(nats_url)
    try:
        return await EmbedClient(nc, Subjects(PREFIX)).chunk(MODEL, texts, spec, EmbedOptions(), 60.0)
    finally:
        await nc.close()


async def _job(nats_url: str, job: str, docs: list[tuple[str, str]], chunking: JobChunking, patience: float = 60.0):
    """Submit a chunked job as reindex does, a document a batch; its state once the tokenizer has cut or
    given up every document (no worker runs here: nothing is embedded)."""
    nc = await _connected(nats_url)
    try:
        js = nc.jetstream()
        subjects = Subjects(PREFIX)
        kv = await ensure_streams(js, subjects)
        await submit(js, kv, subjects, job, MODEL, docs, 1, EmbedOptions(), "inline", chunking=chunking)
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            state = await read_state(kv, job)
            # every batch (a document each) cut, its chunks counted, or given up, its document counted failed
            if state is not None and state.cut.accounted(Rows(0, 0, len(docs), 0)) + state.failed >= len(docs):
                return state
            await asyncio.sleep(0.05)
        raise AssertionError(f"job {job}: not cut within {patience}s: {await read_state(kv, job)}")
    finally:
        await nc.close()


def _within_ceiling(peak: int, idle: int) -> None:
    print(f"peak RSS {peak >> 20} MiB, idle {idle >> 20} MiB")
    assert peak <= 1.2 * idle + MARGIN, f"peak RSS {peak >> 20} MiB, idle {idle >> 20} MiB"


def test_127_inputs_of_65000_characters_in_chunks_of_one_token_are_refused_at_once(tokenizer, nats_url):
    service, idle = tokenizer
    texts = [_text(65_000)] * 127
    with PeakRss(service.proc.pid) as rss:
        started = time.monotonic()
        with pytest.raises(ServiceError) as caught:
            asyncio.run(_chunk(nats_url, texts, ChunkSpec(1)))
        took = time.monotonic() - started
    error = caught.value
    assert (error.code, error.row) == (ErrorCode.INPUT_TOO_LONG, 0)
    assert error.message.startswith(f"takes the request past {MAX_CHUNKS} chunks, the most one may be cut into")
    assert took < FAST, took
    _within_ceiling(rss.peak, idle)
    assert service.alive and asyncio.run(_chunk(nats_url, ["still serving"], ChunkSpec(8))).counts.tolist() == [1]


def test_a_text_over_max_document_chars_is_refused_before_it_is_tokenized(tokenizer, nats_url):
    service, idle = tokenizer
    texts = ["short", _text(MAX_CHARS + 1)]
    with PeakRss(service.proc.pid) as rss:
        started = time.monotonic()
        with pytest.raises(ServiceError) as caught:
            asyncio.run(_chunk(nats_url, texts, ChunkSpec(254)))  # 1,033 windows at most: under --max-chunks
        took = time.monotonic() - started
    assert (caught.value.code, caught.value.row) == (ErrorCode.INPUT_TOO_LONG, 1)
    assert caught.value.message == (
        f"has {MAX_CHARS + 1} characters, over the {MAX_CHARS} a text cut into chunks may have (the tokenizer's "
        "--max-document-chars): cut it into shorter texts"
    )
    assert took < FAST, took
    _within_ceiling(rss.peak, idle)
    # at the limit it is cut, within the same ceiling: one group's encodings at a time
    with PeakRss(service.proc.pid) as rss:
        layout = asyncio.run(_chunk(nats_url, [_text(MAX_CHARS)], ChunkSpec(254)))
    assert 100 < int(layout.counts[0]) <= MAX_CHUNKS
    _within_ceiling(rss.peak, idle)


def test_a_job_document_of_7_5_mb_in_chunks_of_one_token_is_given_up_unread(tokenizer, nats_url):
    service, idle = tokenizer
    chars = 7_500_000
    with PeakRss(service.proc.pid) as rss:
        started = time.monotonic()
        state = asyncio.run(_job(nats_url, "huge", [("book", _text(chars))], JobChunking(ChunkSpec(1)), FAST * 4))
        took = time.monotonic() - started
    assert (state.failed, state.chunks, state.done) == (1, 0, 0), state
    said = (
        f"tokenizer: batch 0: document 'book' has {chars} characters, over the {MAX_CHARS} a text cut into chunks "
        "may have (the tokenizer's --max-document-chars): cut it into shorter texts"
    )
    assert state.errors == (said,), state.errors
    assert took < FAST * 2, took  # publishing 7.5 MB and its dead letter included
    _within_ceiling(rss.peak, idle)
    assert service.alive


def test_a_chunked_jobs_batch_past_its_result_budget_is_given_up_naming_it(tokenizer, nats_url):
    """Three documents of some 70 chunks each, a batch each, at some 112 KB of results a batch: the third
    would take the job past --job-max-result-bytes, and is given up before its token batches are made."""
    docs = [(f"part-{i}", _text(20_000)) for i in range(3)]
    state = asyncio.run(_job(nats_url, "budget", docs, JobChunking(ChunkSpec(64))))
    assert state.failed == 1 and state.chunks > 100, state
    assert state.cut.accounted(Rows(0, 0, 2, 0)) == 2 and state.cut.accounted(Rows(0, 2, 1, 0)) == 0  # not cut
    (reason,) = state.errors
    assert reason.startswith("tokenizer: batch 2: its ") and reason.endswith(
        f"over the {RESULT_BUDGET:,} one job may store (the tokenizer's --job-max-result-bytes): give a larger chunk "
        "size, or fewer documents a job"
    ), reason
