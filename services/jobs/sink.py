"""``reindex --sink URL``: the store opened and its table made or checked before anything is published,
and the sources of a job's rows besides their vectors; the writing is shared/jobs/sink_writer.py's."""

from __future__ import annotations

import asyncio

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.jobs.documents import Document
from embedfleet.shared.jobs.sink_writer import Sources
from embedfleet.shared.sinks import Shape, Sink, SinkError, sink_for


async def open_sink(url: str, shape: Shape) -> Sink:
    """The store ``url`` names, its table made or checked for ``shape``; ConfigError (reindex exits 2,
    nothing published) with the store's message when it cannot take the job's rows now."""
    try:
        sink = sink_for(url)
    except SinkError as exc:
        raise ConfigError(f"--sink: {exc.message}; nothing was published") from None
    try:
        await asyncio.to_thread(sink.open, shape)
    except SinkError as exc:
        await asyncio.to_thread(sink.close)
        later = " (the store may take it later: run the same command again)" if exc.retryable else ""
        raise ConfigError(f"--sink {sink.shown}: {exc.message}; nothing was published{later}") from None
    return sink


def sink_sources(path, docs: list[Document], with_text: bool, chunked: bool) -> Sources:
    """A job's Sources: the input's other fields, and the documents' texts when ``with_text`` asks
    them of a job without chunks (a chunked job's come with its chunks; a job of images has none)."""
    from embedfleet.shared.jobs.documents import read_fields

    texts = {d: t for d, t in docs if isinstance(t, str)} if with_text and not chunked else None
    return Sources(read_fields(path), texts)
