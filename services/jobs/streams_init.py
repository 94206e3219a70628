"""``embedfleet init``: the streams, the job bucket and the jobs' claims created, or brought to this
version's settings. It is the one command that makes or changes them: run it as the operator's NATS
user (``embedfleet auth`` writes ``operator.nk``); the services' users may read the streams, not change
them (shared/permissions.py). ``embedfleet up`` runs it before the services start."""

from __future__ import annotations

from embedfleet.shared.jobs.claims import claims_stream
from embedfleet.shared.jobs.settings import Retention
from embedfleet.shared.jobs.streams import bucket_stream, ensure_streams, stream_names
from embedfleet.shared.nats.config import NatsConfig
from embedfleet.shared.nats.lifecycle import connect_within


async def init_jetstream(nats: NatsConfig, limits: Retention = Retention()) -> int:
    """Create (or bring to this version's settings and ``limits``) the streams and the job bucket, then exit."""
    nc = await connect_within(nats, "embedfleet-init")
    try:
        js = nc.jetstream()
        await ensure_streams(js, nats.subjects, limits)
        names = stream_names(nats.subjects)
        results = (await js.stream_info(names["results"])).config
        bucket = (await js.stream_info(bucket_stream(nats.subjects))).config
        print(
            f"streams {names['jobs']}, {names['bulk']}, {names['results']}, {names['dead']}, "
            f"{claims_stream(nats.subjects)} and bucket {names['kv']} "
            f"are in place on {nats.url}; results: max age {_limit(results.max_age, 's')}, max bytes "
            f"{_limit(results.max_bytes, '')}; job records: ttl {_limit(bucket.max_age, 's')}, history "
            f"{bucket.max_msgs_per_subject}"
        )
        return 0
    finally:
        await nc.close()


def _limit(value: float | int | None, unit: str) -> str:
    return f"{value:.0f}{unit}" if value and value > 0 else "none"
