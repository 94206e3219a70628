"""Jobs' claims on a real nats-server: written once (the server refuses a second), the first of two
submitters' claims is the job's, a batch is taken only with its job's signature, a gateway refuses a
record whose owner was rewritten; services open the streams `embedfleet init` made without changing
them."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import nats
import pytest
from nats.js.errors import APIError

from embedfleet.shared.jobs.bucket import read_state, update_state
from embedfleet.shared.jobs.claims import (
    MAC,
    SUBMITTER,
    ClaimBook,
    ClaimedBucket,
    claim_subject,
    claims_stream,
    first_claim,
    make_claim,
    read_claim,
)
from embedfleet.shared.jobs.settings import Retention
from embedfleet.shared.jobs.state import JobStateError
from embedfleet.shared.jobs.streams import ensure_streams, open_streams, stream_names
from embedfleet.shared.nats.subjects import Subjects
from tests.support.job_states import submitted

# results without a byte limit: a limit reserves its bytes on the server, which many prefixes of one
# test server would run out of
UNRESERVED = Retention(results_max_bytes=0)


def _run(nats_url: str, body):
    async def main():
        nc = await nats.connect(nats_url)
        try:
            subjects = Subjects(f"c{uuid.uuid4().hex[:8]}")
            js = nc.jetstream()
            kv = await ensure_streams(js, subjects, UNRESERVED)
            return await body(js, kv, subjects)
        finally:
            await nc.close()

    return asyncio.run(main())


def test_a_claim_is_written_once_and_the_server_refuses_a_second(nats_url):
    async def body(js, kv, subjects):
        first = await make_claim(js, subjects, "gateway", "j.1/x", "owner-a")
        again = await make_claim(js, subjects, "gateway", "j.1/x", "owner-b")  # finds the first
        with pytest.raises(APIError, match="maximum messages per subject exceeded"):
            await js.publish(claim_subject(subjects, "gateway", "j.1/x"), b'{"job": "j.1/x", "owner": "owner-b"}')
        return first, again, await read_claim(js, subjects, "gateway", "j.1/x")

    first, again, read = _run(nats_url, body)
    assert again == first and read == first and read.owner == "owner-a" and len(read.secret) == 32


def test_the_first_claim_of_two_submitters_is_the_jobs(nats_url):
    async def body(js, kv, subjects):
        gateway = await make_claim(js, subjects, "gateway", "shared-id", None)
        publisher = await make_claim(js, subjects, "publisher", "shared-id", None)
        return gateway, publisher, await first_claim(js, subjects, "shared-id"), await first_claim(js, subjects, "x")

    gateway, publisher, first, none = _run(nats_url, body)
    assert first == gateway and publisher.seq > gateway.seq and none is None


def test_a_batch_is_taken_with_its_jobs_signature_only(nats_url):
    async def body(js, kv, subjects):
        claim = await make_claim(js, subjects, "gateway", "victim", None)
        later = await make_claim(js, subjects, "publisher", "victim", None)  # a second claim of the same id
        book = ClaimBook(js, subjects)
        data = b"a job batch"
        return [
            await book.check("victim", data, claim.sign(data)),
            await book.check("victim", data + b"!", claim.sign(data)),  # altered
            await book.check("victim", data, {}),  # unsigned
            await book.check("victim", data, {MAC: "00" * 32, SUBMITTER: "gateway"}),
            await book.check("victim", data, {MAC: "é" * 64, SUBMITTER: "gateway"}),  # not even ASCII
            await book.check("victim", data, later.sign(data)),  # signed by a later claim
            await book.check("phantom", data, claim.sign(data)),  # no job
        ]

    taken, altered, unsigned, wrong, foreign, later, phantom = _run(nats_url, body)
    assert taken is None
    for refusal in (altered, unsigned, wrong, foreign, later):
        assert refusal == "job victim: the batch's signature is not its submitter's (forged or altered)"
    assert phantom is not None and "never submitted" in phantom


def test_a_gateway_refuses_a_record_whose_owner_was_rewritten(nats_url):
    async def body(js, kv, subjects):
        await make_claim(js, subjects, "gateway", "mine", "digest-a")
        await update_state(kv, "mine", submitted(2, owner="digest-a"))
        await update_state(kv, "theirs", submitted(2, owner="digest-b"))  # claimed by no gateway
        bucket = ClaimedBucket(kv, js, subjects)
        served = await read_state(bucket, "mine")
        await update_state(kv, "mine", lambda s: replace(s, owner="digest-b"))  # another role rewrites it
        refused = []
        for job in ("mine", "theirs"):
            with pytest.raises(JobStateError, match="owner is not the one that made it") as err:
                await read_state(bucket, job)
            refused.append(str(err.value))
        return served, refused

    served, refused = _run(nats_url, body)
    assert served is not None and served.owner == "digest-a" and len(refused) == 2


def test_services_open_the_streams_init_made_without_changing_them(nats_url):
    async def main():
        nc = await nats.connect(nats_url)
        try:
            subjects = Subjects(f"o{uuid.uuid4().hex[:8]}")
            js = nc.jetstream()
            await ensure_streams(js, subjects, Retention(results_max_age=3600, results_max_bytes=0, job_ttl=7200))
            results = stream_names(subjects)["results"]
            before = (await js.stream_info(results)).config
            kv = await open_streams(js, subjects, Retention(results_max_age=60, job_ttl=60))
            after = (await js.stream_info(results)).config
            claims = (await js.stream_info(claims_stream(subjects))).config
            fresh = Subjects(f"n{uuid.uuid4().hex[:8]}")
            made = await open_streams(js, fresh, UNRESERVED)  # none there, and rights to make them: made
            return before, after, claims, kv._name, made._name, fresh
        finally:
            await nc.close()

    before, after, claims, bucket, made, fresh = asyncio.run(main())
    assert after.max_age == before.max_age == 3600 and bucket.endswith("_jobs")
    assert claims.max_msgs_per_subject == 1 and claims.discard_new_per_subject and claims.max_age == 7200
    assert made == stream_names(fresh)["kv"]


def test_a_purged_jobs_id_claimed_again_is_checked_against_its_new_claim(nats_url):
    async def body(js, kv, subjects):
        book = ClaimBook(js, subjects, ttl=600)
        old = await make_claim(js, subjects, "gateway", "again", None)
        first = await book.check("again", b"x", old.sign(b"x"))  # remembered
        await js.purge_stream(claims_stream(subjects), subject=claim_subject(subjects, "gateway", "again"))
        new = await make_claim(js, subjects, "gateway", "again", None)
        return first, new.secret != old.secret, await book.check("again", b"y", new.sign(b"y"))

    first, renewed, taken = _run(nats_url, body)
    assert first is None and renewed and taken is None


def test_a_job_is_resumed_only_the_way_it_was_made(nats_url):
    """The same request through the other submitter is refused before anything is claimed or published
    (its batches would carry another secret); the owner's key, or a resume without a key (an operator's,
    which the gateway checked), goes on; another key is refused."""
    from embedfleet.shared.jobs.publish import JobTaken, submit
    from embedfleet.shared.jobs.requests import Claim
    from embedfleet.shared.protocol import EmbedOptions

    docs = [("a", "one"), ("b", "two"), ("c", "three")]

    async def body(js, kv, subjects):
        def again(submitter: str, owner: str | None):
            claim = Claim("digest", owner)
            return submit(
                js, kv, subjects, "made", "m", docs, 2, EmbedOptions(), "inline", claim=claim, submitter=submitter
            )

        await again("gateway", "owner-a")
        refused = []
        for submitter, owner in (("publisher", None), ("gateway", "owner-b")):
            with pytest.raises(JobTaken) as err:
                await again(submitter, owner)
            refused.append(str(err.value))
        await again("gateway", None)
        await again("gateway", "owner-a")
        info = await js.stream_info(stream_names(subjects)["jobs"])
        return refused, await read_claim(js, subjects, "publisher", "made"), info.state.messages

    refused, publishers, published = _run(nats_url, body)
    assert "was submitted another way" in refused[0] and refused[1] == "job id made is taken: give another job id"
    assert publishers is None and published == 2  # its two batches, once (message ids)
