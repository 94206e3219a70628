"""`up` runs `embedfleet init` before its services start, with its own credential: the streams are made,
and existing ones brought to the retention `up` was given (the services use them as they are)."""

from __future__ import annotations

import asyncio
import os
import uuid

import nats

from embedfleet.services.cli.main import build_parser
from embedfleet.services.up.launch import _init
from embedfleet.shared.jobs.claims import claims_stream
from embedfleet.shared.jobs.streams import stream_names
from embedfleet.shared.nats.subjects import Subjects


def _max_ages(url: str, subjects: Subjects) -> tuple[float, float]:
    async def main() -> tuple[float, float]:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            results = (await js.stream_info(stream_names(subjects)["results"])).config
            claims = (await js.stream_info(claims_stream(subjects))).config
            return results.max_age, claims.max_age
        finally:
            await nc.close()

    return asyncio.run(main())


def test_up_makes_the_streams_and_brings_them_to_its_retention(nats_url):
    prefix = f"u{uuid.uuid4().hex[:8]}"
    for age, ttl in (("120", "600"), ("3600", "7200")):
        ns = build_parser().parse_args(
            ["up", "--subject-prefix", prefix, "--results-max-age", age, "--job-ttl", ttl, "--results-max-bytes", "0"]
        )
        _init(ns, nats_url, dict(os.environ))
        assert _max_ages(nats_url, Subjects(prefix)) == (float(age), float(ttl))
