"""A tiny OTLP/HTTP receiver on 127.0.0.1: decodes protobuf trace exports, keeps the spans.

It stands in for Langfuse (``{host}/api/public/otel/v1/traces``) or any OTLP
collector (``/v1/traces``): every POST whose body is an
``ExportTraceServiceRequest`` (gzip or plain) is decoded and its spans kept.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind)


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as exported, flattened."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    service_name: str
    scope: str
    attributes: dict[str, Any]
    path: str
    authorization: str
    kind: str = "INTERNAL"
    """``SERVER``, ``CLIENT``, ``INTERNAL``... (OTLP's ``SPAN_KIND_`` without the prefix)."""
    links: tuple[tuple[str, str], ...] = ()
    """(trace id, span id) of each linked span."""


@dataclass
class OtlpReceiver:
    """Serves on 127.0.0.1:<free port> in a thread until ``close``."""

    spans: list[ReceivedSpan] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                receiver._receive(self.path, self.headers.get("Authorization") or "", body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def do_GET(self) -> None:  # anything else the SDK may ask
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _receive(self, path: str, authorization: str, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        received = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            service_name=str(resource.get("service.name", "")),
                            scope=scope_spans.scope.name,
                            attributes={kv.key: _value(kv.value) for kv in span.attributes},
                            path=path,
                            authorization=authorization,
                            kind=Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
                            links=tuple(
                                (link.trace_id.hex(), link.span_id.hex()) for link in span.links
                            ),
                        )
                    )
        with self._lock:
            self.paths.append(path)
            self.spans.extend(received)

    def snapshot(self) -> list[ReceivedSpan]:
        """The spans received so far."""
        with self._lock:
            return list(self.spans)

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
