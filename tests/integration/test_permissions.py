"""Least privilege on a real nats-server with the authorization `embedfleet auth` writes: every role
does its whole job under its own nkey user (online embeddings, a rerank, a bulk job from the gateway
and from `embedfleet reindex`, streams made by `embedfleet init`), with no permission violation in the
server's log; and each role is refused what it must not do."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import numpy as np
import pytest

from embedfleet.shared.nats.server import EmbeddedNats
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.permissions import ROLES, role_permissions
from tests.integration.nats_refusals import refusals
from tests.support.corpus import mixed_texts
from tests.support.job_states import submitted
from tests.support.procs import Service, cli, count_services, job_settled, running, wait_until

pytestmark = pytest.mark.integration

MODEL = "all-MiniLM-L6-v2"


class Fabric:
    def __init__(self, server: EmbeddedNats, seeds: Path, base_url: str, services: dict[str, Service]) -> None:
        self.server, self.seeds, self.base_url, self.services = server, seeds, base_url, services
        self.tokenizer_metrics = ""  # the tokenizer's /metrics URL
        self.worker_metrics = ""  # the worker's

    def seed(self, role: str) -> str:
        return str(self.seeds / f"{role}.nk")

    def violations(self) -> list[str]:
        """What the server refused the fleet's own connections (named embedfleet-<role>)."""
        log = (self.server.data_dir / "nats-server.log").read_text(errors="replace")
        return [line for line in log.splitlines() if " Violation - " in line and ":embedfleet-" in line]


@pytest.fixture(scope="module")
def fabric(tmp_path_factory) -> Iterator[Fabric]:
    folder = tmp_path_factory.mktemp("fabric")
    made = subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", "auth", str(folder / "auth")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    conf = folder / "auth" / "auth.conf"
    server = EmbeddedNats(folder / "nats", config=conf.read_text())
    server.start()
    seeds = folder / "auth"
    try:
        init = cli(["init", "--nats", server.url, "--nats-nkey-seed", str(seeds / "operator.nk")])
        assert init.returncode == 0, init.stdout + init.stderr
        from embedfleet.services.up.launch import FreePorts

        with contextlib.closing(FreePorts("127.0.0.1")) as free:
            port, metrics_port, worker_metrics = free(1), free(1), free(1)
        common = ["--nats", server.url]
        role_args = {
            "tokenizer": ["--chunk-seqs", "8", "--metrics-port", str(metrics_port)],
            "worker": ["--max-batch-tokens", "1024", "--metrics-port", str(worker_metrics)],
            "scorer": [],
            "gateway": ["--port", str(port), "--job-sinks", f"lancedb://{folder / 'lance'}"],
        }
        services = {
            role: Service(
                role,
                [*common, *args, "--nats-nkey-seed", str(seeds / f"{role}.nk")],
                folder,
                {"OMP_NUM_THREADS": "1"} if role == "worker" else None,
            )
            for role, args in role_args.items()
        }
        base_url = f"http://127.0.0.1:{port}"
        # a test may replace one of the services: running() stops those the mapping holds at the end
        with running(services, server.url, base_url, nkey_seed=str(seeds / "operator.nk")):
            fabric = Fabric(server, seeds, base_url, services)
            fabric.tokenizer_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
            fabric.worker_metrics = f"http://127.0.0.1:{worker_metrics}/metrics"
            yield fabric
    finally:
        server.stop()


def test_every_role_does_its_whole_job_under_its_permissions(fabric, tmp_path):
    texts = mixed_texts(20)
    r = httpx.post(f"{fabric.base_url}/v1/embeddings", json={"model": MODEL, "input": texts}, timeout=60)
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == 20
    ranked = httpx.post(f"{fabric.base_url}/rerank", json={"query": texts[0], "texts": texts[:6]}, timeout=60)
    assert ranked.status_code == 200 and ranked.json()[0]["index"] == 0, ranked.text
    tokens = httpx.post(f"{fabric.base_url}/tokenize", json={"inputs": "who may publish"}, timeout=30)
    assert tokens.status_code == 200, tokens.text
    docs = [{"id": f"p{i}", "text": t} for i, t in enumerate(texts)]
    job = httpx.post(f"{fabric.base_url}/v1/jobs", json={"documents": docs, "batch_size": 8}, timeout=60)
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    wait_until(
        lambda: httpx.get(f"{fabric.base_url}/v1/jobs/{job_id}", timeout=10).json().get("status") == "done",
        120,
        "the gateway's job",
        list(fabric.services.values()),
    )
    # the job publisher: embedfleet reindex under its own user publishes, follows and collects a job
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(texts[:10])))
    out = tmp_path / "vectors.npy"
    done = cli(
        [
            "reindex",
            str(source),
            "--out",
            str(out),
            "--nats",
            fabric.server.url,
            "--quiet",
            "--nats-nkey-seed",
            fabric.seed("publisher"),
        ]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert np.load(out).shape == (10, 384)
    # the gateway reads the HTTP job's results back; the publisher fetches them to a file
    results = httpx.get(f"{fabric.base_url}/v1/jobs/{job_id}/results", timeout=60)
    assert results.status_code == 200 and len(results.content.splitlines()) == 20, results.text[:300]
    fetched = cli(
        [
            "jobs",
            "fetch",
            job_id,
            "--out",
            str(tmp_path / "fetched.npy"),
            "--nats",
            fabric.server.url,
            "--nats-nkey-seed",
            fabric.seed("publisher"),
        ]
    )
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert np.load(tmp_path / "fetched.npy").shape == (20, 384)
    # the gateway lists them (its own consumer of the job bucket), the operator too
    page = httpx.get(f"{fabric.base_url}/v1/jobs", params={"limit": 100}, timeout=60)
    assert page.status_code == 200 and job_id in [j["id"] for j in page.json()["data"]], page.text[:300]
    listed = cli(["jobs", "--nats", fabric.server.url, "--nats-nkey-seed", fabric.seed("operator")])
    assert listed.returncode == 0 and job_id in listed.stdout, listed.stdout + listed.stderr
    assert fabric.violations() == []


def test_the_gateway_writes_a_job_into_a_store_under_its_permissions(fabric):
    """The rows' sources kept beside the results, the results read and acknowledged, the state's lease:
    all within the gateway's permissions, and nothing refused."""
    import lancedb

    lance = fabric.server.data_dir.parent / "lance"
    docs = [{"id": f"s{i}", "text": t, "n": i} for i, t in enumerate(mixed_texts(12))]
    job = httpx.post(
        f"{fabric.base_url}/v1/jobs",
        json={"documents": docs, "batch_size": 4, "with_text": True, "sink": f"lancedb://{lance}?table=permitted"},
        timeout=60,
    )
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    wait_until(
        lambda: httpx.get(f"{fabric.base_url}/v1/jobs/{job_id}", timeout=10).json().get("status") == "done",
        120,
        "the gateway's sink job",
        list(fabric.services.values()),
    )
    rows = lancedb.connect(str(lance)).open_table("permitted").to_arrow().to_pylist()
    assert sorted((r["id"], r["text"]) for r in rows) == sorted((d["id"], d["text"]) for d in docs)
    assert fabric.violations() == []


def _counter(url: str, name: str) -> float:
    text = httpx.get(url, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_requests_sent_together_are_answered_each_under_the_permissions(fabric):
    """Requests a gateway makes in one pass of its loop reach the tokenizer in one message, and their
    token batches the worker in one message; each is answered on its own, its errors too (through the
    one subject the tokenizer may answer on), with the vectors it gets alone, and nats-server refuses
    nothing."""
    texts = mixed_texts(40)[:24]
    alone = httpx.post(f"{fabric.base_url}/v1/embeddings", json={"model": MODEL, "input": texts}, timeout=60).json()

    def bundled() -> tuple[float, float]:
        return (
            _counter(fabric.tokenizer_metrics, "embedfleet_tokenizer_bundled_total"),
            _counter(fabric.worker_metrics, "embedfleet_worker_bundled_total"),
        )

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=fabric.base_url, timeout=60, limits=httpx.Limits(max_connections=64)
        ) as client:
            posts = [client.post("/v1/embeddings", json={"model": MODEL, "input": t}) for t in texts]
            bad = [client.post("/embed", json={"inputs": t, "prompt_name": "nope"}) for t in texts[:8]]
            return await asyncio.gather(*posts, *bad)

    before = bundled()
    for _ in range(8):  # requests that happen to arrive in one pass: a few rounds make it all but certain
        answers = asyncio.run(together())
        for text, r, want in zip(texts, answers, alone["data"]):
            assert r.status_code == 200, r.text
            got = np.array(r.json()["data"][0]["embedding"])
            assert float(got @ np.array(want["embedding"])) > 0.9999, text
        for r in answers[len(texts) :]:
            assert r.status_code == 400 and "the model has no prompt 'nope'" in r.json()["error"], r.text
        now = bundled()
        if now[0] > before[0] and now[1] > before[1]:
            break
    now = bundled()
    assert now[0] > before[0], "no two requests ever went to the tokenizer in one message"
    assert now[1] > before[1], "no two requests' token batches ever went to the worker in one message"
    assert fabric.violations() == []


def test_a_worker_answers_every_batch_of_one_message_on_its_subject(fabric):
    """Token batches in one Requests message (as a tokenizer sends them), one of them out of the
    vocabulary: under the tokenizer's user, every batch is answered (vectors, or the bad one's error)
    inside Replies on the message's own reply subject, the one the worker may publish to."""
    from embedfleet.shared.protocol import EmbedResult, ErrorReply, Replies, Requests, TokenChunk, decode, encode

    inbox = "_INBOX.embedfleet-tokenizer.bundle"
    rows = [[101, 7592, 102], [101, 99999, 102], [101, 2088, 102]]  # the second: outside the vocabulary
    chunks = [
        encode(
            TokenChunk(
                f"b{i}", MODEL, 0, 1, np.array(ids, "<i4"), np.array([0, 3], "<i4"), time.time() + 30, replies=True
            )
        )
        for i, ids in enumerate(rows)
    ]
    bundle = encode(Requests([f"{inbox}.{i}" for i in range(3)], [""] * 3, chunks))

    async def ask() -> tuple[list, list[str]]:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(
            fabric.server.url,
            nkeys_seed=fabric.seed("tokenizer"),
            error_cb=on_error,
            inbox_prefix="_INBOX.embedfleet-tokenizer",
            allow_reconnect=False,
        )
        got: list = []
        try:
            sub = await nc.subscribe(f"{inbox}.*")
            await nc.publish(Subjects().tokens(MODEL), bundle, reply=f"{inbox}.0")
            answered: dict[str, object] = {}
            while len(answered) < 3:
                msg = await sub.next_msg(timeout=30)
                got.append(msg.subject)
                message = decode(msg.data)
                for subject, payload in (
                    zip(message.subjects, message.messages)
                    if isinstance(message, Replies)
                    else [(msg.subject, msg.data)]
                ):
                    answered[subject] = decode(payload)
            return [answered[f"{inbox}.{i}"] for i in range(3)], got + errors
        finally:
            await nc.close()

    answers, subjects = asyncio.run(ask())
    assert set(subjects) == {f"{inbox}.0"}, subjects  # every answer on the message's subject, nothing refused
    assert isinstance(answers[0], EmbedResult) and isinstance(answers[2], EmbedResult), answers
    assert isinstance(answers[1], ErrorReply) and "vocabulary" in answers[1].message, answers[1]
    a, c = answers[0].array()[0], answers[2].array()[0]
    assert np.isclose(np.linalg.norm(a), 1, atol=1e-4) and float(a @ c) < 0.99  # two texts, two vectors
    assert fabric.violations() == []


def test_a_tokenizer_cannot_answer_for_a_gateway_nor_read_its_inbox(fabric):
    async def act(nc, js):
        await nc.publish("_INBOX.embedfleet-gateway.forged.1", b"a forged result")
        await nc.subscribe("_INBOX.embedfleet-gateway.>")
        await nc.subscribe("_INBOX.>")

    errors = asyncio.run(refusals(fabric.server.url, fabric.seed("tokenizer"), "_INBOX.embedfleet-tokenizer", act, 3))
    assert any('publish to "_inbox.embedfleet-gateway.forged.1"' in e.lower() for e in errors), errors
    assert any('subscription to "_inbox.embedfleet-gateway.>"' in e.lower() for e in errors), errors
    assert any('subscription to "_inbox.>"' in e.lower() for e in errors), errors


def test_a_worker_cannot_delete_or_purge_a_stream(fabric):
    async def act(nc, js):
        for call in (js.delete_stream("EMBEDFLEET_JOBS"), js.purge_stream("EMBEDFLEET_RESULTS")):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(call, 1)

    errors = asyncio.run(refusals(fabric.server.url, fabric.seed("worker"), "_INBOX.embedfleet-worker", act, 2))
    assert any("$js.api.stream.delete.embedfleet_jobs" in e.lower() for e in errors), errors
    assert any("$js.api.stream.purge.embedfleet_results" in e.lower() for e in errors), errors


def test_a_job_publisher_cannot_reach_the_online_subjects(fabric):
    async def act(nc, js):
        await nc.publish("embedfleet.v1.embed.all-MiniLM-L6-v2", b"x")
        await nc.publish("embedfleet.v1.tokens.all-MiniLM-L6-v2", b"x")
        await nc.subscribe("embedfleet.v1.embed.*")

    errors = asyncio.run(refusals(fabric.server.url, fabric.seed("publisher"), "_INBOX.embedfleet-reindex", act, 3))
    assert len([e for e in errors if "permissions violation" in e.lower()]) == 3, errors


def test_without_credentials_no_client_connects(fabric):
    async def anonymous() -> None:
        await nats.connect(fabric.server.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3)

    with pytest.raises(Exception, match="Authorization Violation"):
        asyncio.run(anonymous())


def test_every_role_has_a_seed_and_the_server_file_holds_public_keys_only(fabric):
    conf = (fabric.seeds / "auth.conf").read_text()
    for role in ROLES:
        seed = (fabric.seeds / f"{role}.nk").read_text().strip()
        assert seed.startswith("SU") and seed not in conf
        assert (fabric.seeds / f"{role}.nk").stat().st_mode & 0o077 == 0


def test_roles_are_made_from_the_subject_scheme():
    """Another prefix, other subjects and streams; the operator alone may do anything."""
    worker = role_permissions(Subjects("acme.search"), "worker")
    assert "acme.search.v1.tokens.*" in worker.subscribe and "acme.search.v1.results.*" in worker.publish
    assert "$JS.API.CONSUMER.MSG.NEXT.ACME_SEARCH_BULK.*" in worker.publish
    assert not any("DELETE.ACME_SEARCH_JOBS" in s or "STREAM.DELETE" in s or s == ">" for s in worker.publish)
    for role in ("gateway", "tokenizer", "worker", "scorer", "publisher"):  # streams are the operator's (init)
        calls = role_permissions(Subjects("acme.search"), role).publish
        assert not any(f"STREAM.{call}" in s for s in calls for call in ("CREATE", "UPDATE", "DELETE", "PURGE")), role
    assert role_permissions(Subjects(), "operator").publish == (">",)
    with pytest.raises(ValueError, match="unknown role"):
        role_permissions(Subjects(), "admin")


def test_faults_under_permissions_a_dead_letter_and_a_worker_stopped_mid_job(fabric):
    """A malformed batch a publisher sent is given up by the tokenizer as a dead letter (its stream and
    the job's state written under the tokenizer's user); a worker stopped mid-job hands its batches back
    and a second worker, under the same role's user, finishes the job. Nothing is refused."""
    import msgpack

    from embedfleet.shared.jobs.bucket import update_state
    from embedfleet.shared.jobs.claims import make_claim
    from embedfleet.shared.jobs.streams import open_streams, stream_names
    from embedfleet.shared.protocol import EmbedOptions, JobBatch, encode

    subjects = Subjects()

    async def poison() -> dict:
        nc = await nats.connect(
            fabric.server.url, nkeys_seed=fabric.seed("publisher"), inbox_prefix="_INBOX.embedfleet-reindex"
        )
        js = nc.jetstream()
        kv = await open_streams(js, subjects)  # made by init: the publisher may not change them
        claim = await make_claim(js, subjects, "publisher", "poison", None)  # its batches signed
        await update_state(kv, "poison", submitted(4, model=MODEL, batches=2, status="running"))
        good = JobBatch("poison", 0, MODEL, ["a", "b"], ["one", "two"], EmbedOptions())
        await js.publish(
            subjects.jobs(MODEL), encode(good), headers={"Nats-Msg-Id": "poison:0", **claim.sign(encode(good))}
        )
        bad = msgpack.packb(
            {"v": 2, "t": "job", "jb": "poison", "bi": 1, "m": MODEL, "di": ["c", "d"], "x": ["three", 4], "o": {}}
        )
        await js.publish(subjects.jobs(MODEL), bad, headers={"Nats-Msg-Id": "poison:1", **claim.sign(bad)})
        state = await job_settled(kv, "poison")
        await nc.close()
        return state

    state = asyncio.run(poison())
    assert state["status"] == "done_with_errors" and state["done"] == 2 and state["failed"] == 2, state

    async def dead_letter():
        nc = await nats.connect(fabric.server.url, nkeys_seed=fabric.seed("operator"))
        try:
            return await nc.jetstream().get_last_msg(stream_names(subjects)["dead"], subjects.dead("poison"))
        finally:
            await nc.close()

    assert asyncio.run(dead_letter()).headers["Embedfleet-Stage"] == "tokenizer"

    second = Service(
        "worker",
        ["--nats", fabric.server.url, "--max-batch-tokens", "1024", "--nats-nkey-seed", fabric.seed("worker")],
        fabric.server.data_dir.parent,
        {"OMP_NUM_THREADS": "1"},
    )
    try:
        wait_until(
            lambda: count_services(fabric.server.url, "worker", nkey_seed=fabric.seed("operator")) == 2,
            120,
            "the second worker",
            [second],
        )
        docs = [{"id": f"f{i}", "text": t} for i, t in enumerate(mixed_texts(160))]
        job = httpx.post(f"{fabric.base_url}/v1/jobs", json={"documents": docs, "batch_size": 8}, timeout=60).json()[
            "id"
        ]
        first = fabric.services["worker"]
        wait_until(
            lambda: httpx.get(f"{fabric.base_url}/v1/jobs/{job}", timeout=10).json().get("done", 0) > 0,
            60,
            "the job under way",
            [first, second],
        )
        assert first.stop() == 0  # drains: hands back what it has not started, says it is leaving
        wait_until(
            lambda: httpx.get(f"{fabric.base_url}/v1/jobs/{job}", timeout=10).json().get("status") == "done",
            180,
            "the job, finished by the second worker",
            [second],
        )
        assert httpx.get(f"{fabric.base_url}/v1/jobs/{job}", timeout=10).json()["done"] == 160
    finally:
        fabric.services["worker"] = second  # the fixture stops it
    assert fabric.violations() == []
