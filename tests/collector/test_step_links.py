"""At trace detail ``steps``, through the Collector into Jaeger v2: from a stalled request to the engine
step it waited in, and from that step to every request in it, by the links Jaeger's query API (what its
UI shows) gives.

``otel-llm demo`` runs with ``OTEL_LLM_TRACE_DETAIL=steps`` and exports to the Collector loaded from
``collector-config/local/otelcol.yaml``; the Collector's Tempo exporter feeds a real OTLP receiver that
records what was forwarded, the reference the stall and the requests are read from.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_llm import semconv as sc
from tests.collector.jaeger_view import jaeger_trace
from tests.collector.local_stack import LocalStack
from tests.otlp_receivers import GrpcReceiver, attributes

SERVICE = "otel-llm-demo-steps"


@pytest.fixture(scope="module")
def forwarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, list[Any]]]:
    """The stack, and every span the Collector forwarded, once the demo's have all arrived."""
    work: Path = tmp_path_factory.mktemp("step-links")
    tempo = GrpcReceiver()
    tempo.start()
    stack = None
    try:
        stack = LocalStack(work, tempo.port)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=stack.otlp_grpc,
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            OTEL_SERVICE_NAME=SERVICE,
            OTEL_LLM_TRACE_DETAIL="steps",
        )
        demo = subprocess.run(
            [sys.executable, "-m", "otel_llm.kit.cli", "demo"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert tempo.collected.wait_until(
            lambda c: (
                any(s.name == sc.SPAN_ENGINE_WINDOW for _, s in c.spans())
                and len([s for _, s in c.spans() if s.name == sc.SPAN_REQUEST]) == 32
            ),
            timeout_s=60,
        ), "the Collector did not forward the demo's requests and its engine window"
        yield stack, [s for _, s in tempo.collected.spans()]
    finally:
        if stack is not None:
            stack.stop()
        tempo.stop()


def links(shown: dict[str, Any]) -> set[tuple[str, str]]:
    """The (trace id, span id) pairs a span of Jaeger's JSON links to (OTLP links: FOLLOWS_FROM)."""
    return {
        (r["traceID"], r["spanID"]) for r in shown.get("references", []) if r["refType"] == "FOLLOWS_FROM"
    }


def tag(shown: dict[str, Any], key: str) -> Any:
    return {t["key"]: t["value"] for t in shown["tags"]}.get(key)


def test_from_a_stalled_request_to_its_step_and_to_every_request_in_it(forwarded) -> None:
    stack, spans = forwarded
    requests = {attributes(s.attributes)[sc.LLM_REQUEST_ID]: s for s in spans if s.name == sc.SPAN_REQUEST}
    by_trace: dict[str, list[Any]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id.hex(), []).append(s)
    # The demo's prefill stall, as the forwarded trace has it: the stalled request and its token's time.
    stalls = [
        (s, e)
        for s in spans
        if s.name == sc.SPAN_DECODE
        for e in s.events
        if e.name == sc.EVENT_STALL and attributes(e.attributes)[sc.LLM_STALL_CAUSE] == sc.STALL_PREFILL
    ]
    assert stalls, "the demo is built to show a prefill stall"
    decode, event = stalls[0]
    culprit = attributes(event.attributes)[sc.LLM_STALL_REQUESTS][0]
    trace_id = decode.trace_id.hex()
    (stalled,) = [s for s in by_trace[trace_id] if s.name == sc.SPAN_REQUEST]

    # In Jaeger: the stalled request's step span that ends at the stalled token links to the engine's.
    ends = {
        s.span_id.hex(): s.end_time_unix_nano for s in by_trace[trace_id] if s.name == sc.SPAN_ENGINE_STEP
    }
    assert event.time_unix_nano in ends.values(), (event.time_unix_nano, sorted(ends.values()))
    shown = jaeger_trace(stack.jaeger_url, trace_id, len(by_trace[trace_id]))
    (step,) = [
        s
        for s in shown["spans"]
        if s["operationName"] == sc.SPAN_ENGINE_STEP and ends.get(s["spanID"]) == event.time_unix_nano
    ]
    (target,) = links(step)
    engine_trace, engine_step_id = target
    engine = jaeger_trace(stack.jaeger_url, engine_trace, len(by_trace[engine_trace]))
    (engine_step,) = [s for s in engine["spans"] if s["spanID"] == engine_step_id]
    assert engine_step["operationName"] == sc.SPAN_ENGINE_STEP
    assert tag(engine_step, sc.LLM_STEP_INDEX) == tag(step, sc.LLM_STEP_INDEX)
    assert tag(engine_step, sc.LLM_STEP_PREFILL_TOKENS) > 0
    (window,) = [s for s in engine["spans"] if s["operationName"] == sc.SPAN_ENGINE_WINDOW]
    assert {r["spanID"] for r in engine_step["references"] if r["refType"] == "CHILD_OF"} == {
        window["spanID"]
    }

    # From the step to every request in it: the stalled one and the one whose prompt it computed among
    # them, each an llm.request Jaeger has.
    reached = links(engine_step)
    wanted = {(stalled.trace_id.hex(), stalled.span_id.hex())}
    wanted.add((requests[culprit].trace_id.hex(), requests[culprit].span_id.hex()))
    assert wanted <= reached
    for linked_trace, linked_span in reached:
        other = jaeger_trace(stack.jaeger_url, linked_trace, len(by_trace[linked_trace]))
        (root,) = [s for s in other["spans"] if s["spanID"] == linked_span]
        assert root["operationName"] == sc.SPAN_REQUEST
