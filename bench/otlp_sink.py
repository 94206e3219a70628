"""A local OTLP/HTTP trace receiver: what an OpenTelemetry collector does with ``POST /v1/traces``,
kept in memory. The tests read the spans the services exported; the benchmark gives tracing
somewhere real to export to (the exporter's cost is part of what tracing costs)."""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class ReceivedSpan:
    service: str  # the resource's service.name
    name: str
    trace_id: str  # hex
    span_id: str
    parent_id: str  # "" for a root
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict = field(default_factory=dict)
    error: bool = False


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class OtlpSink:
    """``start()`` listens on 127.0.0.1 (a free port); ``url`` is the endpoint to give the services."""

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.requests = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name for the handler
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                sink._add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-sink", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> OtlpSink:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _add(self, request: ExportTraceServiceRequest) -> None:
        got: list[ReceivedSpan] = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            service = resource.get("service.name", "")
            for scope in resource_spans.scope_spans:
                got.extend(
                    ReceivedSpan(
                        service=service,
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        kind=KINDS.get(s.kind, str(s.kind)),
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        error=s.status.code == 2,
                    )
                    for s in scope.spans
                )
        with self._lock:
            self._spans.extend(got)
            self.requests += 1

    def spans(self, trace_id: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._spans)

    def wait_for(self, trace_id: str, predicate, timeout: float = 30.0) -> list[ReceivedSpan]:
        """The trace's spans once ``predicate(spans)`` holds; TimeoutError (listing what came) if it never does."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans(trace_id)
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                got = ", ".join(f"{s.service}:{s.name}" for s in spans) or "none"
                raise TimeoutError(f"trace {trace_id}: the spans never completed within {timeout:.0f}s (got: {got})")
            time.sleep(0.05)
