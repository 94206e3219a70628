"""What a sink job's rows hold besides their vectors, kept in the results stream beside its results.

A job the gateway writes into a store (``POST /v1/jobs`` with ``"sink"``) was given its documents'
other fields (the rows' metadata) and, with ``with_text``, their texts in the request; a gateway that
takes the job's writing over after another died (services/gateway/jobs/sinks.py) must find them again.
They go to ``<prefix>.v1.results.<job>.sources`` as a few messages, each under the connection's
payload limit, with message ids (a repeat is dropped), kept as long as the results and purged with them:

    {"part": i, "parts": n, "ids": [str], "fields": [map | nil] | nil, "texts": [str] | nil}

Read back, each message is checked (msgpack, types, lengths) before anything is kept.
"""

from __future__ import annotations

import logging

import msgpack
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from embedfleet.shared.jobs.publish import publish_durably
from embedfleet.shared.jobs.sink_writer import Sources
from embedfleet.shared.jobs.streams import stream_names
from embedfleet.shared.jobs.work_queue import close_pull
from embedfleet.shared.nats.subjects import Subjects

log = logging.getLogger("embedfleet.jobs.sources")

FETCH_WAIT = 2.0  # seconds a fetch waits for parts the stream holds


class SourcesLost(Exception):
    """The stream holds none or only some of a job's sources (expired, purged, or never published)."""


def parts_of(ids: list[str], sources: Sources, limit: int) -> list[bytes]:
    """``sources`` of the documents ``ids`` as messages of at most ``limit`` bytes; none when the job
    has neither fields nor texts. A document whose fields and text alone pass ``limit`` raises ValueError."""
    if sources.fields is None and sources.texts is None:
        return []
    groups: list[list[str]] = [[]]
    size = 0
    for doc_id in ids:
        fields = (sources.fields or {}).get(doc_id)
        one = len(msgpack.packb([doc_id, fields, (sources.texts or {}).get(doc_id)])) + 16
        if one > limit - 256:
            raise ValueError(f"document {doc_id!r}: its text and fields ({one} bytes) pass the NATS message limit")
        if size + one > limit - 256 and groups[-1]:
            groups.append([])
            size = 0
        groups[-1].append(doc_id)
        size += one
    return [
        msgpack.packb(
            {
                "part": i,
                "parts": len(groups),
                "ids": group,
                "fields": None if sources.fields is None else [sources.fields.get(d) for d in group],
                "texts": None if sources.texts is None else [sources.texts.get(d) for d in group],
            }
        )
        for i, group in enumerate(groups)
    ]


async def publish_sources(js: JetStreamContext, subjects: Subjects, job: str, messages: list[bytes]) -> None:
    for i, data in enumerate(messages):
        await publish_durably(js, subjects.sources(job), data, f"{job}:sources:{i}")


def _part(data: bytes, limit: int) -> dict:
    """One message, checked: ValueError when it is not a part of the form above."""
    if len(data) > limit:
        raise ValueError(f"{len(data)} bytes")
    part = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    if not isinstance(part, dict) or not all(isinstance(part.get(k), int) for k in ("part", "parts")):
        raise ValueError("not a sources part")
    ids = part.get("ids")
    if not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)) or not 0 <= part["part"] < part["parts"]:
        raise ValueError("bad ids or part number")
    for key, kind in (("fields", dict), ("texts", str)):
        column = part.get(key)
        if column is not None and not (
            isinstance(column, list)
            and len(column) == len(ids)
            and all(v is None or isinstance(v, kind) for v in column)
        ):
            raise ValueError(f"bad {key}")
    return part


async def read_sources(js: JetStreamContext, subjects: Subjects, job: str, limit: int) -> Sources:
    """A job's sources as published; an empty Sources when it has none. SourcesLost when the stream
    holds only some of them, or parts that are not sources (published by someone else)."""
    from nats.errors import TimeoutError as NatsTimeoutError

    stream, subject = stream_names(subjects)["results"], subjects.sources(job)
    info = await js.stream_info(stream, subjects_filter=subject)
    held = (info.state.subjects or {}).get(subject, 0)
    if not held:
        return Sources(None, None)
    psub = await js.pull_subscribe(
        subject,
        stream=stream,
        config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, inactive_threshold=30.0),
    )
    parts: dict[int, dict] = {}
    wanted = None
    try:
        while len(parts) < held and (wanted is None or len(parts) < wanted):
            try:
                msgs = await psub.fetch(min(16, held - len(parts)), timeout=FETCH_WAIT)
            except (TimeoutError, NatsTimeoutError):
                break
            for msg in msgs:
                try:
                    part = _part(msg.data, limit)
                except Exception as exc:
                    raise SourcesLost(f"job {job}: a message in its sources is not one ({exc})") from None
                wanted = part["parts"]
                parts[part["part"]] = part
    finally:
        await close_pull(psub)
    if wanted is None or sorted(parts) != list(range(wanted)):
        raise SourcesLost(f"job {job}: the results stream holds {len(parts)} of its {wanted or '?'} parts of sources")
    fields: dict[str, dict] | None = None
    texts: dict[str, str] | None = None
    for part in parts.values():
        if part.get("fields") is not None:
            fields = fields if fields is not None else {}
            fields.update((d, f) for d, f in zip(part["ids"], part["fields"]) if f is not None)
        if part.get("texts") is not None:
            texts = texts if texts is not None else {}
            texts.update((d, t) for d, t in zip(part["ids"], part["texts"]) if t is not None)
    return Sources(fields, texts)
