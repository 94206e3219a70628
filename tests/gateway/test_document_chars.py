"""POST /v1/jobs's documents within the gateway's --max-document-chars: one past it is refused with 413
naming the limit before anything is published (the job has no record, the jobs stream holds nothing);
one at it is taken. JobsApi over a real nats-server."""

from __future__ import annotations

import asyncio
import uuid

import nats
import orjson
import pytest

from embedfleet.services.gateway.errors import ApiError
from embedfleet.services.gateway.jobs_api import JobsApi, parse_job
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.job_bucket import read_state
from embedfleet.shared.job_streams import ensure_streams, stream_names
from embedfleet.shared.subjects import Subjects

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
