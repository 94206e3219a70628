"""reindex's chunking options (``--chunk-size``, ``--chunk-overlap``, ``--chunk-boundary``,
``--late-chunking``, ``--with-text``), checked before anything is published: their values here, the
window against the model's room by asking a tokenizer (shared/jobs/fit.py)."""

from __future__ import annotations

import argparse

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.errors import ServiceError
from embedfleet.shared.jobs.fit import JobRefused, check_chunk_room
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import EmbedOptions
from embedfleet.shared.text_chunks import ChunkSpec, JobChunking

# the request field a message names -> reindex's flag
_FLAGS = {
    "chunking.size": "--chunk-size",
    "chunking.overlap": "--chunk-overlap",
    "chunking.boundary": "--chunk-boundary",
}


def _flags(message: str) -> str:
    for field, flag in _FLAGS.items():
        message = message.replace(field, flag)
    return message


def chunking_of(ns: argparse.Namespace, output: str) -> JobChunking | None:
    """The job's chunking from the options (None: a vector a document); ConfigError for what cannot be
    run: a value out of range, a flag that needs --chunk-size without it."""
    if ns.chunk_size is None:
        needing = [
            flag
            for flag, given in (
                ("--chunk-overlap", ns.chunk_overlap is not None),
                ("--chunk-boundary", ns.chunk_boundary is not None),
                ("--late-chunking", ns.late_chunking),
                # a sink stores each document's text where asked
                ("--with-text", ns.with_text and not getattr(ns, "sink", None)),
            )
            if given
        ]
        if needing:
            raise ConfigError(f"{needing[0]} needs --chunk-size (the most tokens of text a chunk holds)")
        return None
    try:
        spec = ChunkSpec(
            ns.chunk_size, 0 if ns.chunk_overlap is None else ns.chunk_overlap, ns.chunk_boundary or "token"
        )
    except ServiceError as exc:
        raise ConfigError(_flags(exc.message)) from None
    if output != "dense":
        raise ConfigError(f"--chunk-size: chunked jobs make a dense vector a chunk, not {output} vectors")
    return JobChunking(spec, ns.late_chunking, ns.with_text)


async def check_room(nc, subjects: Subjects, model: str, chunking: JobChunking, options: EmbedOptions) -> None:
    """ConfigError when the model cannot hold ``chunking``'s windows with the job's prompt."""
    from embedfleet.shared.nats.embed_client import EmbedClient

    client = EmbedClient(nc, subjects, retries=0)
    await client.start()
    try:
        await check_chunk_room(client, model, chunking, options)
    except JobRefused as exc:
        raise ConfigError(_flags(str(exc))) from None
    finally:
        await client.stop()
