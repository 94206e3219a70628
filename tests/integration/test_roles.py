"""The attacks of a NATS role on shared state, against a real nats-server with the users `embedfleet
auth` writes and a fleet (gateway with two API keys, tokenizer, worker) under them: each is refused by
the server (a permission violation, a write-once stream) or by the tokenizer (a forged job batch), and
the stream's config, the consumers, the claim and the victim's job are as they were."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats
import pytest
from nats.js.api import ConsumerConfig, StreamConfig

from embedfleet.shared.jobs.claims import claim_subject, claims_stream, make_claim, read_claim
from embedfleet.shared.jobs.requests import owner_digest
from embedfleet.shared.jobs.streams import bucket_stream, stream_names
from embedfleet.shared.nats.server import EmbeddedNats
from embedfleet.shared.nats.subjects import Subjects, inbox_prefix, model_token
from embedfleet.shared.permissions import CONNECTION_NAMES
from tests.integration.nats_refusals import refusals
from tests.support.procs import Service, cli, stop_all, wait_ready, wait_until

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"
SUBJECTS = Subjects()
NAMES = stream_names(SUBJECTS)
KEY_A, KEY_B = "key-a-" + "a" * 24, "key-b-" + "b" * 24
SERVICE_ROLES = ("gateway", "tokenizer", "worker", "scorer", "publisher")


@dataclass
class Fleet:
    server: EmbeddedNats
    seeds: Path
    base_url: str
    tokenizer_metrics: str
    services: list[Service]
    victim: str  # a job key A made, done

    def seed(self, role: str) -> str:
        return str(self.seeds / f"{role}.nk")


def _get(fleet: Fleet, path: str, key: str) -> httpx.Response:
    return httpx.get(f"{fleet.base_url}{path}", headers={"authorization": f"Bearer {key}"}, timeout=30)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[Fleet]:
    folder = tmp_path_factory.mktemp("roles")
    made = cli(["auth", str(folder / "auth")])
    assert made.returncode == 0, made.stderr
    seeds = folder / "auth"
    server = EmbeddedNats(folder / "nats", config=(seeds / "auth.conf").read_text())
    server.start()
    services: list[Service] = []
    try:
        init = cli(["init", "--nats", server.url, "--nats-nkey-seed", str(seeds / "operator.nk")])
        assert init.returncode == 0, init.stdout + init.stderr
        from embedfleet.services.up.launch import FreePorts

        with contextlib.closing(FreePorts("127.0.0.1")) as free:
            port, metrics_port = free(1), free(1)
        role_args = {
            "tokenizer": ["--metrics-port", str(metrics_port)],
            "worker": ["--max-batch-tokens", "1024"],
            "gateway": ["--port", str(port), "--api-keys", f"{KEY_A},{KEY_B}"],
        }
        for role, args in role_args.items():
            env = {"OMP_NUM_THREADS": "1"} if role == "worker" else None
            seed = ["--nats-nkey-seed", str(seeds / f"{role}.nk")]
            services.append(Service(role, ["--nats", server.url, *args, *seed], folder, env))
        base_url = f"http://127.0.0.1:{port}"
        wait_ready(services, server.url, base_url, nkey_seed=str(seeds / "operator.nk"))
        docs = [{"id": f"v{i}", "text": f"the victim's document number {i}"} for i in range(6)]
        r = httpx.post(
            f"{base_url}/v1/jobs",
            json={"documents": docs, "batch_size": 2, "id": "victim"},
            headers={"authorization": f"Bearer {KEY_A}"},
            timeout=60,
        )
        assert r.status_code == 202, r.text
        fleet = Fleet(server, seeds, base_url, f"http://127.0.0.1:{metrics_port}/metrics", services, "victim")
        wait_until(
            lambda: _get(fleet, "/v1/jobs/victim", KEY_A).json().get("status") == "done", 120, "the victim", services
        )
        yield fleet
    finally:
        stop_all(services)
        server.stop()


async def _tried(*calls) -> None:
    """JetStream calls the server is expected to refuse, made at once: nats-py hears each refusal as an
    error (a permission violation has no reply, so each call times out: together, in one second)."""

    async def one(call) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(call, 1)

    await asyncio.gather(*(one(call) for call in calls))


def _operator(fleet: Fleet, body):
    async def main():
        nc = await nats.connect(fleet.server.url, nkeys_seed=fleet.seed("operator"))
        try:
            return await body(nc.jetstream())
        finally:
            await nc.close()

    return asyncio.run(main())


def _configs(fleet: Fleet) -> dict[str, dict]:
    async def body(js):
        names = [NAMES[k] for k in ("jobs", "bulk", "results", "dead")] + [bucket_stream(SUBJECTS)]
        return {n: (await js.stream_info(n)).config.as_dict() for n in [*names, claims_stream(SUBJECTS)]}

    return _operator(fleet, body)


@pytest.mark.parametrize("role", SERVICE_ROLES)
def test_no_service_role_may_change_or_remove_a_stream(fleet, role):
    """The publisher adding the online subjects to the results stream, the worker setting its
    max_msgs to 1, a purge, a deletion, a stream of one's own capturing requests: each refused."""
    before = _configs(fleet)

    async def read(js):
        return [(await js.stream_info(name)).config for name in (NAMES["results"], bucket_stream(SUBJECTS))]

    results, bucket = _operator(fleet, read)

    async def act(nc, js):
        await _tried(
            js.update_stream(results.evolve(subjects=[*results.subjects, "embedfleet.v1.embed.*"])),
            js.update_stream(results.evolve(max_msgs=1)),
            js.update_stream(bucket.evolve(max_age=1)),
            js.purge_stream(NAMES["results"]),
            js.delete_stream(NAMES["jobs"]),
            js.add_stream(StreamConfig(name="CAPTURE", subjects=["embedfleet.v1.embed.>"])),
        )

    errors = await_refusals(fleet, role, act, 6)
    for call in (
        f"stream.update.{NAMES['results']}",
        f"stream.update.{bucket_stream(SUBJECTS)}",
        f"stream.purge.{NAMES['results']}",
        f"stream.delete.{NAMES['jobs']}",
        "stream.create.capture",
    ):
        assert any("permissions violation" in e and call.lower() in e for e in errors), (call, errors)
    assert _configs(fleet) == before


def await_refusals(fleet: Fleet, role: str, act, want: int) -> list[str]:
    """What the server refused ``act(nc, js)`` run as ``role``'s user, in lower case; an exception
    ``act`` raises (an assertion) fails the test."""
    inbox = inbox_prefix(CONNECTION_NAMES[role])
    errors = asyncio.run(refusals(fleet.server.url, fleet.seed(role), inbox, act, want, quiet=False))
    return [e.lower() for e in errors]


CONSUMERS = {  # a role, and another role's durable consumer it must not touch
    "worker": (NAMES["jobs"], f"tokenizers-{model_token(MODEL)}"),
    "tokenizer": (NAMES["bulk"], f"workers-{model_token(MODEL)}"),
    "publisher": (NAMES["jobs"], f"tokenizers-{model_token(MODEL)}"),
    "gateway": (NAMES["bulk"], f"workers-{model_token(MODEL)}"),
}


@pytest.mark.parametrize("role", sorted(CONSUMERS))
def test_a_role_may_not_touch_another_roles_consumers(fleet, role):
    stream, durable = CONSUMERS[role]

    def config() -> dict:
        async def body(js):
            return (await js.consumer_info(stream, durable)).config.as_dict()

        return _operator(fleet, body)

    before = config()

    async def act(nc, js):
        await _tried(
            js.consumer_info(stream, durable),
            js.delete_consumer(stream, durable),
            js.add_consumer(stream, ConsumerConfig(durable_name=durable, max_deliver=1, ack_wait=1)),
        )

    errors = await_refusals(fleet, role, act, 3)
    # created as nats-py asks for a durable: $JS.API.CONSUMER.DURABLE.CREATE.<stream>.<name>
    for call in (
        f"consumer.info.{stream}.{durable}",
        f"consumer.delete.{stream}.{durable}",
        f"create.{stream}.{durable}",
    ):
        assert any("permissions violation" in e and call.lower() in e for e in errors), (call, errors)
    assert config() == before


def test_a_claim_is_neither_rewritten_nor_read_by_another_role(fleet):
    """The publisher may not write or read the gateway's claim (the victim's owner and secret); the
    gateway's own second claim is refused by the stream (one message a subject); it is unchanged."""
    subject = claim_subject(SUBJECTS, "gateway", fleet.victim)

    def claim():
        return _operator(fleet, lambda js: read_claim(js, SUBJECTS, "gateway", fleet.victim))

    before = claim()
    assert before is not None and before.owner == owner_digest(KEY_A)
    forged = b'{"job": "victim", "owner": "%s", "secret": "%s"}' % (owner_digest(KEY_B).encode(), b"00" * 32)

    async def publisher(nc, js):
        await nc.publish(subject, forged)
        await _tried(
            js.get_last_msg(claims_stream(SUBJECTS), subject, direct=True),
            js.get_msg(claims_stream(SUBJECTS), seq=before.seq),
        )

    errors = await_refusals(fleet, "publisher", publisher, 3)
    assert any("permissions violation" in e and subject.lower() in e for e in errors), errors
    assert any("permissions violation" in e and f"direct.get.{claims_stream(SUBJECTS)}".lower() in e for e in errors)
    assert any(
        "permissions violation" in e and f"stream.msg.get.{claims_stream(SUBJECTS)}".lower() in e for e in errors
    )

    async def gateway(nc, js):
        with pytest.raises(nats.js.errors.APIError, match="maximum messages per subject exceeded"):
            await js.publish(subject, forged)

    assert await_refusals(fleet, "gateway", gateway, 0) == []
    assert claim() == before


def _refused_batches(fleet: Fleet) -> float:
    text = httpx.get(fleet.tokenizer_metrics, timeout=10).text
    name = "embedfleet_tokenizer_refused_batches_total{"
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def _victim(fleet: Fleet) -> tuple[dict, int]:
    """The victim's job as its key reads it, and its results' lines."""
    state = _get(fleet, f"/v1/jobs/{fleet.victim}", KEY_A).json()
    results = _get(fleet, f"/v1/jobs/{fleet.victim}/results", KEY_A)
    assert results.status_code == 200, results.text
    return {k: state.get(k) for k in ("status", "documents", "done", "failed", "tokens")}, len(
        results.content.splitlines()
    )


def test_a_forged_batch_is_refused_and_the_victims_job_unchanged(fleet):
    """Batches the publisher sends naming the victim (unsigned; signed with the publisher's own, later
    claim of the same id) and naming no job: refused by the tokenizer and counted, nothing merged —
    the victim still shows 6 done of 6 with 6 results, the phantom has no record."""
    from embedfleet.shared.jobs.bucket import read_state
    from embedfleet.shared.protocol import EmbedOptions, JobBatch, encode

    before, lines = _victim(fleet)
    assert before["status"] == "done" and before["done"] == 6 and lines == 6
    refused = _refused_batches(fleet)
    phantom = f"phantom-{uuid.uuid4().hex[:8]}"

    async def publisher(nc, js):
        forged = encode(JobBatch(fleet.victim, 3, MODEL, ["x1"], ["a forged row"], EmbedOptions()))
        await js.publish(SUBJECTS.jobs(MODEL), forged, headers={"Nats-Msg-Id": f"{fleet.victim}:3"})
        own = await make_claim(js, SUBJECTS, "publisher", fleet.victim, None)  # allowed: its own name space
        again = encode(JobBatch(fleet.victim, 4, MODEL, ["x2"], ["another forged row"], EmbedOptions()))
        await js.publish(SUBJECTS.jobs(MODEL), again, headers={"Nats-Msg-Id": f"{fleet.victim}:4", **own.sign(again)})
        ghost = encode(JobBatch(phantom, 0, MODEL, ["g"], ["a row of no job"], EmbedOptions()))
        await js.publish(SUBJECTS.jobs(MODEL), ghost, headers={"Nats-Msg-Id": f"{phantom}:0"})

    assert await_refusals(fleet, "publisher", publisher, 0) == []
    wait_until(lambda: _refused_batches(fleet) >= refused + 3, 60, "three refused batches", fleet.services)

    async def check(js):
        kv = await js.key_value(NAMES["kv"])
        letters = await js.stream_info(NAMES["dead"], subjects_filter=SUBJECTS.dead(fleet.victim))
        results = await js.stream_info(NAMES["results"], subjects_filter=SUBJECTS.results(phantom))
        return (
            await read_state(kv, phantom),
            (letters.state.subjects or {}).get(SUBJECTS.dead(fleet.victim), 0),
            (results.state.subjects or {}).get(SUBJECTS.results(phantom), 0),
        )

    record, letters, phantom_results = _operator(fleet, check)
    assert record is None and phantom_results == 0
    assert letters == 2  # kept for the operator to see, counted in no job
    after, after_lines = _victim(fleet)
    assert after == before and after_lines == lines


def _record(fleet: Fleet) -> tuple[bytes, int, bytes | None]:
    """The victim's record as the bucket holds it (value, revision), and its progress key's value."""
    from embedfleet.shared.jobs.bucket import progress_key

    async def body(js):
        kv = await js.key_value(NAMES["kv"])
        entry = await kv.get(fleet.victim)
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            return entry.value, entry.revision, (await kv.get(progress_key(fleet.victim))).value
        return entry.value, entry.revision, None

    return _operator(fleet, body)


@pytest.mark.parametrize("role", ["tokenizer", "worker"])
def test_a_stage_neither_rewrites_nor_deletes_a_jobs_record(fleet, role):
    """A tokenizer's or worker's user writes a job's progress key only (its counts): its rewrite, delete
    and purge of the victim's record are refused by the server, and the record and the job's answer
    are as they were. The victim's counts, 6 done of 6, came through its progress key."""
    import orjson

    from embedfleet.shared.jobs.bucket import progress_key

    before, lines = _victim(fleet)
    record, revision, progress = _record(fleet)
    assert before["status"] == "done" and before["done"] == 6
    assert "done" not in orjson.loads(record) and progress is not None and orjson.loads(progress)["done"] == 6
    subject = f"$KV.{NAMES['kv']}.{fleet.victim}"

    async def act(nc, js):
        kv = await js.key_value(NAMES["kv"])
        await _tried(
            kv.put(fleet.victim, record.replace(b'"documents":6', b'"documents":600')),
            kv.update(fleet.victim, b"{}", last=revision),
            kv.delete(fleet.victim),
            kv.purge(fleet.victim),
        )
        assert (await kv.get(fleet.victim)).revision == revision  # it reads the record as every stage does
        await kv.put(progress_key(f"other-{role}"), b"{}")  # its own keys: allowed

    errors = await_refusals(fleet, role, act, 4)
    assert sum("permissions violation" in e and subject.lower() in e for e in errors) == 4, errors
    assert not any(progress_key("other").lower() in e for e in errors), errors
    assert _record(fleet) == (record, revision, progress)
    assert _victim(fleet) == (before, lines)


def test_a_rewritten_owner_is_not_served_to_another_key(fleet):
    """The publisher rewrites the victim's owner digest in the job bucket (its user writes records):
    the gateway checks the record against the job's claim and serves it to neither key; B never
    reads it. Last in this module: the victim's record stays rewritten."""
    from dataclasses import replace

    from embedfleet.shared.jobs.bucket import update_state

    assert _get(fleet, f"/v1/jobs/{fleet.victim}", KEY_B).status_code == 404  # another key's job: as none

    async def publisher(nc, js):
        kv = await js.key_value(NAMES["kv"])
        await update_state(kv, fleet.victim, lambda s: replace(s, owner=owner_digest(KEY_B)))

    assert await_refusals(fleet, "publisher", publisher, 0) == []
    listed = _get(fleet, "/v1/jobs", KEY_B)
    assert listed.status_code == 200 and fleet.victim not in [j["id"] for j in listed.json()["data"]], listed.text
    for key in (KEY_B, KEY_A):
        for path in (f"/v1/jobs/{fleet.victim}", f"/v1/jobs/{fleet.victim}/results"):
            r = _get(fleet, path, key)
            assert r.status_code >= 400 and '"v0"' not in r.text, (key, path, r.status_code, r.text[:200])


def test_a_service_waits_for_init_to_make_a_missing_stream(fleet):
    """A stream missing (the dead letters'), a service's user may not make it: the service waits, and
    goes on once `embedfleet init`, run by the operator, has made it. Last: the stream is made anew."""
    from embedfleet.shared.jobs.streams import open_streams

    _operator(fleet, lambda js: js.delete_stream(NAMES["dead"]))

    async def gateway(nc, js):
        opening = asyncio.ensure_future(open_streams(js, SUBJECTS, wait=60))
        await asyncio.sleep(6)  # its attempt to make them refused (after the JetStream request timeout)
        assert not opening.done()
        init = await asyncio.to_thread(
            cli, ["init", "--nats", fleet.server.url, "--nats-nkey-seed", fleet.seed("operator")]
        )
        assert init.returncode == 0, init.stderr
        kv = await asyncio.wait_for(opening, 10)
        assert kv._name == NAMES["kv"]

    errors = await_refusals(fleet, "gateway", gateway, 1)
    assert any("permissions violation" in e and "stream.create" in e for e in errors), errors
    assert NAMES["dead"] in _configs(fleet)
