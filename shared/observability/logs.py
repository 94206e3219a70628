"""Log lines of every process: text for people, or one JSON object a line for log pipelines
(``--log-format json``). Both carry the request id and trace id of the request being handled."""

from __future__ import annotations

import logging
import time

import orjson

from embedfleet.shared.observability.tracing import current, current_request


def _not_tls_eof_noise(record: logging.LogRecord) -> bool:
    # asyncio warns about nats-py's stream protocol each time a TLS connection to NATS closes
    # ("returning true from eof_received() has no effect when using ssl", nats.py issue #727): harmless
    return "eof_received()" not in record.getMessage()


class _RequestIds(logging.Filter):
    """Puts the handled request's ids on each record (``request_id``, ``trace_id``, ``span_id``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = current()
        record.request_id = current_request()
        record.trace_id = context.trace_id if context is not None else ""
        record.span_id = context.span_id if context is not None else ""
        return True


class TextFormatter(logging.Formatter):
    def __init__(self, role: str) -> None:
        super().__init__(f"%(asctime)s %(levelname)s {role} %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = [
            f"{key}={value}"
            for key, value in (
                ("request", getattr(record, "request_id", "")),
                ("trace", getattr(record, "trace_id", "")),
            )
            if value
        ]
        return f"{line} [{' '.join(ids)}]" if ids else line


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (RFC 3339, UTC), level, service, logger, message, the ids, and
    the exception's traceback as one string."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self._role = role

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self._role,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("request_id", "trace_id", "span_id"):
            if value := getattr(record, key, ""):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def setup_logging(level: str, role: str, fmt: str = "text") -> None:
    """Every logger of the process (uvicorn's too: the gateway gives it no config of its own) writes
    through one handler on stderr, in ``fmt``."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(role) if fmt == "json" else TextFormatter(role))
    handler.addFilter(_RequestIds())
    handler.addFilter(_not_tls_eof_noise)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
