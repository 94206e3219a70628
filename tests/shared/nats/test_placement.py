"""Replicas of the job streams and the bucket, on a real 3-node nats-server cluster on loopback and on
a single server: 3 copies where the cluster can place them, 1 on a single server, an existing stream
raised in place (its contents kept) and never lowered by the automatic choice, an option that names a
count exactly, and a count the servers cannot place refused with their reason (new) or kept and said
(existing). A stage's consumer keeps as many copies as its stream."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Iterator

import nats
import pytest

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.jobs.claims import claims_stream
from embedfleet.shared.jobs.settings import JobSettings, Retention
from embedfleet.shared.jobs.streams import bucket_stream, ensure_streams, stream_names
from embedfleet.shared.jobs.work_queue import open_work
from embedfleet.shared.nats.placement import AUTO_REPLICAS, Placement
from embedfleet.shared.nats.server import NatsCluster
from embedfleet.shared.nats.subjects import Subjects

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory) -> Iterator[str]:
    with NatsCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster.url


def _run(url: str, body) -> None:
    async def main() -> None:
        nc = await nats.connect(url.split(","))
        try:
            await body(nc.jetstream(), Subjects(f"r{uuid.uuid4().hex[:8]}"))
        finally:
            await nc.close()

    asyncio.run(main())


def _names(subjects: Subjects) -> list[str]:
    names = stream_names(subjects)
    return [
        names["jobs"],
        names["bulk"],
        names["results"],
        names["dead"],
        bucket_stream(subjects),
        claims_stream(subjects),
    ]


async def _peers(js, stream: str, consumer: str) -> set[str]:
    """The nodes holding a copy of a consumer's state (from the server's own answer)."""
    reply = json.loads((await js._nc.request(f"$JS.API.CONSUMER.INFO.{stream}.{consumer}", b"", timeout=5)).data)
    cluster = reply.get("cluster") or {}
    return {cluster.get("leader"), *(p["name"] for p in cluster.get("replicas") or [])} - {None}


async def _replicas(js, subjects: Subjects) -> dict[str, int]:
    return {name: (await js.stream_info(name)).config.num_replicas for name in _names(subjects)}


def test_a_cluster_gets_three_copies_of_every_stream_and_the_bucket(cluster_url):
    async def body(js, subjects):
        await ensure_streams(js, subjects)
        assert set((await _replicas(js, subjects)).values()) == {AUTO_REPLICAS}
        for name in _names(subjects):  # placed on three different nodes
            cluster = (await js.stream_info(name)).cluster
            assert len({cluster.leader, *(p.name for p in cluster.replicas)}) == 3, cluster
        stream = stream_names(subjects)["bulk"]
        await open_work(js, stream, "w", subjects.bulk("m"), JobSettings())
        assert len(await _peers(js, stream, "w")) == AUTO_REPLICAS

    _run(cluster_url, body)


def test_a_single_server_gets_one_copy_and_refuses_more(nats_url):
    async def body(js, subjects):
        with pytest.raises(ConfigError, match=r"--stream-replicas 3: NATS cannot place 3 copies of \w+: replicas > 1"):
            await ensure_streams(js, subjects, Retention(replicas=3))
        await ensure_streams(js, subjects)
        assert set((await _replicas(js, subjects)).values()) == {1}

    _run(nats_url, body)


def test_one_copy_streams_are_raised_in_place_with_their_contents_and_consumers(cluster_url):
    async def body(js, subjects):
        kv = await ensure_streams(js, subjects, Retention(replicas=1))  # as made before replication
        assert set((await _replicas(js, subjects)).values()) == {1}
        stream = stream_names(subjects)["bulk"]
        await open_work(js, stream, "w", subjects.bulk("m"), JobSettings())
        await js.publish(subjects.bulk("m"), b"held", headers={"Nats-Msg-Id": "j:0:0"})
        await kv.put("j", b"{}")
        await ensure_streams(js, subjects)  # the automatic choice: raised to 3
        assert set((await _replicas(js, subjects)).values()) == {AUTO_REPLICAS}
        assert (await js.stream_info(stream)).state.messages == 1
        assert (await kv.get("j")).value == b"{}"
        psub = await open_work(js, stream, "w", subjects.bulk("m"), JobSettings())
        # the consumer follows its stream once the stream's new peers have settled (~12 s here)
        deadline = time.monotonic() + 60
        while len(await _peers(js, stream, "w")) < AUTO_REPLICAS:
            assert time.monotonic() < deadline, "the consumer kept one copy"
            await asyncio.sleep(0.5)
        (msg,) = await psub.fetch(1, timeout=5)
        assert msg.data == b"held"

    _run(cluster_url, body)


def test_a_count_given_is_set_exactly_and_the_automatic_one_never_lowers(cluster_url):
    async def body(js, subjects):
        await ensure_streams(js, subjects)
        await ensure_streams(js, subjects, Retention(replicas=1))  # given: lowered
        assert set((await _replicas(js, subjects)).values()) == {1}
        await ensure_streams(js, subjects, Retention(replicas=2))
        assert set((await _replicas(js, subjects)).values()) == {2}
        automatic = Placement(js, None)
        assert automatic.replicas == AUTO_REPLICAS and automatic.target(5) == 5 and automatic.target(1) == 3
        assert Placement(js, 2).target(5) == 2

    _run(cluster_url, body)


def test_more_copies_than_nodes_are_refused_new_and_kept_existing(cluster_url, caplog):
    async def body(js, subjects):
        with pytest.raises(
            ConfigError, match=r"--stream-replicas 5: NATS cannot place 5 copies of .*no suitable peers"
        ):
            await ensure_streams(js, subjects, Retention(replicas=5))
        fresh = Subjects(f"{subjects.prefix}x")
        await ensure_streams(js, fresh)
        with caplog.at_level(logging.WARNING, logger="embedfleet.jobs"):
            await ensure_streams(js, fresh, Retention(replicas=5))  # existing: kept at 3, said
        assert set((await _replicas(js, fresh)).values()) == {AUTO_REPLICAS}
        kept = {r.getMessage().split()[0] for r in caplog.records if r.levelno == logging.WARNING}
        assert kept == set(_names(fresh))

    _run(cluster_url, body)
