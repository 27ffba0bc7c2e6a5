"""Real OTLP receivers for tests: gRPC and HTTP/protobuf servers on loopback, ephemeral ports.

Both decode what arrives with the official protobuf definitions (opentelemetry-proto) and keep every
request, its path or method, and its headers in a ``Collected`` store that tests poll with a deadline.
A receiver runs in one of four modes, so fault tests can reuse it:

- ``Mode.ACCEPT``: decode, keep, answer success;
- ``Mode.SLOW``: like ACCEPT, after ``delay_s`` seconds;
- ``Mode.REFUSE``: answer gRPC ``UNAVAILABLE`` / HTTP 503, or the ``answer`` given (a gRPC status code
  or an HTTP status), keep nothing (counted in ``refused``);
- ``Mode.BLACK_HOLE``: take the request and never answer until the receiver stops.

``closed_port()`` gives a loopback port nothing listens on, for "collector down" tests.
"""

from __future__ import annotations

import enum
import gzip
import http.server
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from otel_llm import semconv as sc

DEFAULT_WAIT_S = 20.0


class Mode(enum.Enum):
    ACCEPT = "accept"
    SLOW = "slow"
    REFUSE = "refuse"
    BLACK_HOLE = "black_hole"


@dataclass
class Received:
    """One export request as it arrived."""

    signal: str  # "traces" or "metrics"
    request: Any  # ExportTraceServiceRequest or ExportMetricsServiceRequest
    path: str  # HTTP path, or the gRPC method
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names


class Collected:
    """Thread-safe store of decoded requests with polling helpers."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: list[Received] = []
        self.refused = 0

    def add(self, item: Received) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()

    def count_refused(self) -> None:
        with self._cond:
            self.refused += 1
            self._cond.notify_all()

    def received(self, signal: str | None = None) -> list[Received]:
        with self._cond:
            return [r for r in self._items if signal is None or r.signal == signal]

    def spans(self) -> list[tuple[resource_pb2.Resource, trace_pb2.Span]]:
        """Every span received so far, with the resource it came under."""
        return [
            (rs.resource, span)
            for r in self.received("traces")
            for rs in r.request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def metrics(self, name: str | None = None) -> list[tuple[resource_pb2.Resource, metrics_pb2.Metric]]:
        """Every metric (one per export it appeared in), optionally only those called ``name``."""
        return [
            (rm.resource, metric)
            for r in self.received("metrics")
            for rm in r.request.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            if name is None or metric.name == name
        ]

    def wait_until(self, predicate: Callable[[Collected], bool], timeout_s: float = DEFAULT_WAIT_S) -> bool:
        """Poll ``predicate(self)`` until it holds or ``timeout_s`` passes; return its last value."""
        deadline = time.monotonic() + timeout_s
        while True:
            if predicate(self):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            # Woken by each arriving request; the short cap covers a notify that raced the check.
            with self._cond:
                self._cond.wait(min(remaining, 0.2))


def closed_port() -> int:
    """A loopback TCP port that nothing listens on (bound once, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Receiver:
    """Shared mode handling: what to do with a request before keeping it."""

    def __init__(self, mode: Mode, delay_s: float, port: int, answer: Any = None) -> None:
        self.mode = mode
        self.delay_s = delay_s
        self.answer = answer  # what REFUSE answers, when not the default
        self.collected = Collected()
        self._stopping = threading.Event()
        self._held_lock = threading.Lock()
        self._held = 0
        # 0: an ephemeral port; a fixed one lets a test restart "the collector" where it was.
        self.port = port

    def _hold(self) -> bool:
        """Apply SLOW / BLACK_HOLE; return False when the request must be refused."""
        if self.mode is Mode.BLACK_HOLE:
            with self._held_lock:
                self._held += 1
            self._stopping.wait()
        elif self.mode is Mode.SLOW:
            self._stopping.wait(self.delay_s)
        if self.mode is Mode.REFUSE:
            self.collected.count_refused()
            return False
        return True

    @property
    def held(self) -> int:
        """BLACK_HOLE: how many export requests arrived and are being held unanswered (all of them, until
        the receiver stops)."""
        with self._held_lock:
            return self._held

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class GrpcReceiver(_Receiver):
    """The official OTLP TraceService and MetricsService on ``127.0.0.1:<port>`` (ephemeral by default)."""

    def __init__(
        self, mode: Mode = Mode.ACCEPT, delay_s: float = 1.0, port: int = 0, answer: Any = None
    ) -> None:
        super().__init__(mode, delay_s, port, answer)
        self._server: grpc.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceServicer(self), self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsServicer(self), self._server)
        bound = self._server.add_insecure_port(f"127.0.0.1:{self.port}")
        if self.port and bound != self.port:
            raise OSError(f"could not bind port {self.port} again")
        self.port = bound
        self._server.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.stop(grace=None)

    def handle(self, signal: str, request: Any, context: grpc.ServicerContext, method: str) -> None:
        if not self._hold():
            context.abort(self.answer or grpc.StatusCode.UNAVAILABLE, "test receiver refuses")
        headers = {k.lower(): v for k, v in context.invocation_metadata() if isinstance(v, str)}
        self.collected.add(Received(signal, request, method, headers))


class _TraceServicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: GrpcReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:  # name fixed by the gRPC service
        self._receiver.handle("traces", request, context, "TraceService/Export")
        return trace_service_pb2.ExportTraceServiceResponse()


class _MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: GrpcReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:  # name fixed by the gRPC service
        self._receiver.handle("metrics", request, context, "MetricsService/Export")
        return metrics_service_pb2.ExportMetricsServiceResponse()


_HTTP_SIGNALS = {
    "traces": (trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse),
    "metrics": (
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
    ),
}


class HttpReceiver(_Receiver):
    """OTLP/HTTP with binary protobuf bodies: POST ``.../traces`` and ``.../metrics`` (gzip / deflate aware).

    The signal is taken from the last path segment, so per-signal endpoints with custom paths work too;
    the path is kept on each ``Received`` so tests can check the endpoint rules.
    """

    def __init__(
        self, mode: Mode = Mode.ACCEPT, delay_s: float = 1.0, port: int = 0, answer: Any = None
    ) -> None:
        super().__init__(mode, delay_s, port, answer)
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # name fixed by http.server
                receiver._handle(self)

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="otlp-http-rx", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        path = handler.path
        signal = path.rstrip("/").rsplit("/", 1)[-1]
        body = handler.rfile.read(int(handler.headers.get("Content-Length", "0")))
        if signal not in _HTTP_SIGNALS:
            self._reply(handler, 404, b"")
            return
        if not self._hold():
            self._reply(handler, self.answer or 503, b"")
            return
        if self._stopping.is_set() and self.mode is Mode.BLACK_HOLE:
            return  # never answered
        encoding = handler.headers.get("Content-Encoding", "").lower()
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        request_type, response_type = _HTTP_SIGNALS[signal]
        request = request_type()
        request.ParseFromString(body)
        headers = {k.lower(): v for k, v in handler.headers.items()}
        self.collected.add(Received(signal, request, path, headers))
        self._reply(handler, 200, response_type().SerializeToString())

    @staticmethod
    def _reply(handler: http.server.BaseHTTPRequestHandler, status: int, body: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/x-protobuf")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


# --- helpers shared by the wire and file tests ------------------------------------------------------

# The ten histograms of docs/telemetry.md's metrics table, written out here (not read from the package), so a
# histogram the package stops emitting fails every test that expects "all of them".
HISTOGRAMS = (
    sc.METRIC_TTFT,
    sc.METRIC_TPOT,
    sc.METRIC_REQUEST_DURATION,
    sc.METRIC_QUEUE,
    sc.METRIC_PREFILL,
    sc.METRIC_DECODE,
    sc.METRIC_INFERENCE,
    sc.METRIC_ITL,
    sc.METRIC_PREEMPTED,
    sc.METRIC_RECOMPUTE,
)


def clear_otel_env(monkeypatch: Any) -> None:
    """Remove every OTEL_* variable, so a test sees only the configuration it sets itself."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name, raising=False)


def attributes(key_values: Any) -> dict[str, Any]:
    """A protobuf ``repeated KeyValue`` as a plain dict (arrays become lists)."""

    def value(any_value: Any) -> Any:
        kind = any_value.WhichOneof("value")
        if kind == "array_value":
            return [value(v) for v in any_value.array_value.values]
        return getattr(any_value, kind) if kind else None

    return {kv.key: value(kv.value) for kv in key_values}


# A caller's W3C trace context, as an HTTP frontend would pass it to queued(carrier=...).
CALLER_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN_ID = "00f067aa0ba902b7"
CALLER_TRACEPARENT = f"00-{CALLER_TRACE_ID}-{CALLER_SPAN_ID}-01"


@dataclass(frozen=True)
class ScenarioCounts:
    """What docs/lifecycle.md says the three scenario requests produce (worked out by hand, not by code)."""

    requests: int = 3
    # r1 and r3: request, queue, prefill, decode; r2 adds one preempted and one recompute span.
    spans: int = 4 + 6 + 4
    with_first_token: int = 3
    # One sample per tokens event after a request's first: r1 has 3 events, r2 has 4, r3 has 1.
    itl_samples: int = 2 + 3 + 0
    preemptions: int = 1


def drive_scenario(tracker: Any, t0: float) -> ScenarioCounts:
    """Three requests sharing engine steps, timestamps in monotonic seconds from ``t0``.

    r1: plain, finishes ``stop``. r2: preempted during decode (after two tokens events), rescheduled,
    finishes ``stop``. r3: arrives with the caller's ``traceparent``, finishes ``length``.
    """
    tracker.queued("r1", ts=t0, prompt_tokens=7, attributes={"gen_ai.request.max_tokens": 16})
    tracker.queued("r2", ts=t0 + 0.001, prompt_tokens=5)
    tracker.queued("r3", ts=t0 + 0.002, prompt_tokens=3, carrier={"traceparent": CALLER_TRACEPARENT})
    tracker.scheduled(["r1", "r2"], ts=t0 + 0.010)
    tracker.tokens(["r1", "r2"], ts=t0 + 0.030)
    tracker.tokens(["r1", "r2"], ts=t0 + 0.040)
    tracker.preempted(["r2"], ts=t0 + 0.045)
    tracker.scheduled(["r3"], ts=t0 + 0.050)
    tracker.tokens(["r1"], ts=t0 + 0.050)
    tracker.finished("r1", reason="stop", ts=t0 + 0.055)
    tracker.tokens(["r3"], ts=t0 + 0.060)
    tracker.finished("r3", reason="length", ts=t0 + 0.065)
    tracker.scheduled(["r2"], ts=t0 + 0.070)
    tracker.tokens(["r2"], ts=t0 + 0.090)
    tracker.tokens(["r2"], ts=t0 + 0.100)
    tracker.finished("r2", reason="stop", ts=t0 + 0.105)
    return ScenarioCounts()
