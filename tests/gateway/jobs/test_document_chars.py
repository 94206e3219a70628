"""POST /v1/jobs's documents within the gateway's --max-document-chars, and a job's vectors within
--job-max-result-bytes: past either, 413 naming the limit before anything is published (the job has
no record, the jobs stream holds nothing); at it, taken. JobsApi over a real nats-server."""

from __future__ import annotations

import asyncio
import uuid

import nats
import orjson
import pytest

from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.jobs.api import JobsApi, parse_job
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.jobs.bucket import read_state
from embedfleet.shared.jobs.streams import ensure_streams, stream_names
from embedfleet.shared.nats.fleet import FleetView
from embedfleet.shared.nats.subjects import Subjects

LIMIT = 100


def _body(job: str, texts: list[str], chunking: dict | None) -> bytes:
    docs = [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)]
    return orjson.dumps({"id": job, "model": "m", "documents": docs, **({"chunking": chunking} if chunking else {})})


@pytest.mark.parametrize("chunking", [None, {"size": 1}], ids=["plain", "chunked"])
def test_a_document_over_the_limit_is_refused_before_anything_is_published(nats_url, chunking):
    async def main() -> None:
        nc = await nats.connect(nats_url)
        try:
            js, subjects = nc.jetstream(), Subjects(f"t{uuid.uuid4().hex[:8]}")
            kv = await ensure_streams(js, subjects)
            api = JobsApi(js, kv, subjects, None, max_document_chars=LIMIT)
            with pytest.raises(ApiError) as caught:
                await api.create(parse_job(_body("over", ["short", "x" * (LIMIT + 1)], chunking)), "m")
            error = caught.value
            assert (error.code, error.status, error.param) == (ErrorCode.INPUT_TOO_LONG, 413, "documents")
            assert error.message == (
                f"document 1 ('d1') has {LIMIT + 1} characters; the limit is {LIMIT} (the gateway's "
                "--max-document-chars): cut it into shorter documents"
            )
            assert await read_state(kv, "over") is None
            assert (await js.stream_info(stream_names(subjects)["jobs"])).state.messages == 0
            status, answer = await api.create(parse_job(_body("at", ["short", "x" * LIMIT], chunking)), "m")
            assert (status, answer["documents"]) == (202, 2)
            assert (await js.stream_info(stream_names(subjects)["jobs"])).state.messages == 1
        finally:
            await nc.close()

    asyncio.run(main())


def test_a_job_whose_vectors_pass_the_result_budget_is_refused_before_anything_is_published(nats_url):
    served = FleetView({"m": {"max_seq_length": "256", "dim": "384"}}, {"m": {"dim": "384", "outputs": "dense"}}, 0.0)
    texts = ["a text"] * 10  # ids d0..d9: 10 x (1536 + 5 + 2) = 15,430 bytes of float32 vectors

    async def main() -> None:
        nc = await nats.connect(nats_url)
        try:
            js, subjects = nc.jetstream(), Subjects(f"t{uuid.uuid4().hex[:8]}")
            kv = await ensure_streams(js, subjects)
            api = JobsApi(js, kv, subjects, None, max_result_bytes=15_429)
            with pytest.raises(ApiError) as caught:
                await api.create(parse_job(_body("big", texts, None)), "m", served, 8 << 20)
            error = caught.value
            assert (error.code, error.status, error.param) == (ErrorCode.PAYLOAD_TOO_LARGE, 413, "documents")
            assert error.message == (
                "the job's 10 documents' vectors may take 15,430 bytes in the results stream, over the 15,429 one "
                "job may store (--job-max-result-bytes): submit them as several jobs"
            )
            assert await read_state(kv, "big") is None
            assert (await js.stream_info(stream_names(subjects)["jobs"])).state.messages == 0
            api = JobsApi(js, kv, subjects, None, max_result_bytes=15_430)
            status, _ = await api.create(parse_job(_body("fits", texts, None)), "m", served, 8 << 20)
            assert status == 202
        finally:
            await nc.close()

    asyncio.run(main())
