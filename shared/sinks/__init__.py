"""Vector stores a re-index job's rows can go to besides files (``reindex --sink URL``).

``sink_for(url)`` picks the store by the URL's scheme: ``postgresql://`` (pgvector), ``lancedb://``,
``qdrant://``. The stores' clients are the extra ``embedfleet[sinks]``: a sink whose client is not
installed is refused when its URL is given (``checked_sink``: a command's flag, before it starts;
``sink_for``: a job's at its request), naming the extra to install.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.extras import MissingExtra, installed
from embedfleet.shared.sinks.base import ClientMissing, Hit, Rows, Shape, Sink, SinkError

# scheme -> (module, class, the modules its store's client is made of)
_STORES = {
    "postgresql": ("embedfleet.shared.sinks.pgvector", "PgVectorSink", ("psycopg", "pgvector")),
    "postgres": ("embedfleet.shared.sinks.pgvector", "PgVectorSink", ("psycopg", "pgvector")),
    "lancedb": ("embedfleet.shared.sinks.lance", "LanceSink", ("lancedb",)),
    "qdrant": ("embedfleet.shared.sinks.qdrant", "QdrantSink", ("qdrant_client",)),
}
SCHEMES = tuple(_STORES)


def sink_for(url: str) -> Sink:
    """The sink a URL names; SinkError (not retryable) for an unknown scheme or a bad URL, ClientMissing
    where the store's client is not installed here. Nothing is connected to."""
    import importlib

    scheme = urlsplit(url).scheme
    if scheme not in _STORES:
        raise SinkError(
            f"unknown sink {scheme + '://' if scheme else url!r}: a sink is postgresql://, lancedb:// or qdrant://",
            retryable=False,
        )
    module, name, clients = _STORES[scheme]
    sink = getattr(importlib.import_module(module), name)(url)  # the sinks import their clients where used
    for client in clients:
        if not installed(client):
            raise ClientMissing(client, sink.shown)
    return sink


def with_table(url: str, table: str) -> str:
    """``url`` naming ``table`` (Qdrant's ``collection``) instead of its own; its other parameters kept."""
    parts = urlsplit(url)
    name = "collection" if parts.scheme == "qdrant" else "table"
    params = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != name] + [(name, table)]
    # by hand: urlunsplit drops the "//" of an empty host (lancedb:///PATH, libpq's sockets, qdrant:///PATH)
    return f"{parts.scheme}://{parts.netloc}{parts.path}?{urlencode(params, safe='/', quote_via=quote)}"


def checked_sink(url: str, flag: str) -> None:
    """A sink URL a command's ``flag`` gives, checked before the command starts (nothing connected to:
    the store may come up later): ConfigError naming the flag, MissingExtra naming the extra to install
    where the store's client is not installed."""
    try:
        sink_for(url)
    except ClientMissing as exc:
        raise MissingExtra(exc.module, f"{flag} {exc.shown}") from None
    except SinkError as exc:
        raise ConfigError(f"{flag}: {exc.message}") from None


__all__ = [
    "SCHEMES",
    "ClientMissing",
    "Hit",
    "Rows",
    "Shape",
    "Sink",
    "SinkError",
    "checked_sink",
    "sink_for",
    "with_table",
]
