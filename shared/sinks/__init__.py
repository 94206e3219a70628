"""Vector stores a re-index job's rows can go to besides files (``reindex --sink URL``).

``sink_for(url)`` picks the store by the URL's scheme: ``postgresql://`` (pgvector), ``lancedb://``,
``qdrant://``. The stores' clients are the extra ``embedfleet[sinks]``; a sink whose client is missing
is refused with the package to install.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from embedfleet.shared.sinks.base import Hit, Rows, Shape, Sink, SinkError

# scheme -> (module, class, the packages its client needs)
_STORES = {
    "postgresql": ("embedfleet.shared.sinks.pgvector", "PgVectorSink", "psycopg[binary] pgvector"),
    "postgres": ("embedfleet.shared.sinks.pgvector", "PgVectorSink", "psycopg[binary] pgvector"),
    "lancedb": ("embedfleet.shared.sinks.lance", "LanceSink", "lancedb"),
    "qdrant": ("embedfleet.shared.sinks.qdrant", "QdrantSink", "qdrant-client"),
}
SCHEMES = tuple(_STORES)


def sink_for(url: str) -> Sink:
    """The sink a URL names; SinkError (not retryable) for an unknown scheme, a missing client or a bad URL."""
    import importlib

    scheme = urlsplit(url).scheme
    if scheme not in _STORES:
        raise SinkError(
            f"unknown sink {scheme + '://' if scheme else url!r}: a sink is postgresql://, lancedb:// or qdrant://",
            retryable=False,
        )
    module, name, packages = _STORES[scheme]
    try:
        cls = getattr(importlib.import_module(module), name)
        return cls(url)
    except ImportError as exc:
        raise SinkError(
            f"the {scheme} sink needs {packages}: pip install 'embedfleet[sinks]' ({exc})", retryable=False
        ) from None


__all__ = ["Hit", "Rows", "SCHEMES", "Shape", "Sink", "SinkError", "sink_for"]
