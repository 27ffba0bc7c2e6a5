"""A real uvicorn server on a loopback ephemeral port, in a thread, around the reference engine.

The tracker writes to in-memory exporters of a real SDK TracerProvider, so tests can look at the spans
each HTTP request produced. Clients (the official ``openai`` package, or raw sockets) talk to it over TCP.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

pytest.importorskip("torch", reason="the reference engine needs the torch extra")
pytest.importorskip("fastapi", reason="the server needs the serve extra (fastapi, uvicorn)")

import uvicorn
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.kit.engine import EngineConfig, LLMEngine
from otel_llm.kit.server import create_app

MODEL = "tiny-test-model"
WAIT_S = 10.0


@dataclass
class Served:
    base_url: str  # http://127.0.0.1:<port>
    port: int
    engine: LLMEngine
    tracker: RequestTracker
    spans: InMemorySpanExporter

    def request_span(self, request_id: str, timeout_s: float = WAIT_S) -> ReadableSpan:
        """The finished ``llm.request`` span of ``request_id`` (spans are built when a request finishes)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for span in self.spans.get_finished_spans():
                if span.name == sc.SPAN_REQUEST and span.attributes.get(sc.LLM_REQUEST_ID) == request_id:
                    return span
            time.sleep(0.01)
        raise AssertionError(f"no llm.request span for {request_id} within {timeout_s}s")

    def trace(self, trace_id: int) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.context.trace_id == trace_id]

    def request_spans(self) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == sc.SPAN_REQUEST]


@pytest.fixture(scope="module")
def serve() -> Iterator[Callable[..., Served]]:
    """Start servers on demand (``serve(num_kv_blocks=...)``); all stop when the module's tests end."""
    running: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(**config: int) -> Served:
        spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        tracker = RequestTracker(tracer_provider=provider, model=MODEL)
        engine = LLMEngine(EngineConfig(**config), tracker=tracker, tracer_provider=provider)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(create_app(engine, model=MODEL), log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
        thread.start()
        running.append((server, thread))
        deadline = time.monotonic() + WAIT_S
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        port = sock.getsockname()[1]
        return Served(f"http://127.0.0.1:{port}", port, engine, tracker, spans)

    yield start
    for server, thread in running:
        server.should_exit = True
        thread.join(WAIT_S)
