"""collector-config/scaled/ as a fleet on one machine: agents, trace-id routing, tail-sampling gateways.

Two ``otel-llm demo`` processes send to different agents; the agents' ``load_balancing`` exporters route
by trace id to two gateways; each gateway computes span metrics from every span, tail-samples, and sends
what it keeps to its own trace store (a real OTLP receiver). The tail-sampling decision comes
``decision_wait`` (60 s, as shipped) after a trace's first span, so the fleet's fixture waits that long.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from otel_llm import semconv as sc
from tests.collector.processes import poll
from tests.collector.scaled_stack import SCALED, ScaledStack
from tests.otlp_receivers import attributes

REQUESTS = 12  # per demo process
SERVICES = ("otel-llm-demo-a", "otel-llm-demo-b")
# gateway.yaml's slow-first-token policy. Not proven here: how slow the demo's first tokens are depends on
# the machine's load, so no run is sure to have a slow request that no other policy keeps.
SLOW_TTFT_S = 2.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScaledStack]:
    work = tmp_path_factory.mktemp("scaled")
    stack = None
    demos: list[subprocess.Popen] = []
    try:
        stack = ScaledStack(work)
        for service, port in zip(SERVICES, stack.agent_ports):
            env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
            env.update(
                OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                OTEL_SERVICE_NAME=service,
            )
            demos.append(
                subprocess.Popen(
                    [sys.executable, "-m", "otel_llm.cli", "demo", "--requests", str(REQUESTS)],
                    cwd=work,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        for demo in demos:
            _, err = demo.communicate(timeout=300)
            assert demo.returncode == 0, err
        gateway = yaml.safe_load((SCALED / "gateway.yaml").read_text())
        wait_s = float(gateway["processors"]["tail_sampling"]["decision_wait"].rstrip("s"))
        batch_s = float(gateway["processors"]["batch"]["timeout"].rstrip("s"))
        time.sleep(wait_s + batch_s + 5)  # every decision taken and its batch sent
        yield stack
    finally:
        for demo in demos:
            if demo.poll() is None:
                demo.kill()
                demo.wait(10)
        if stack is not None:
            stack.stop()


def kept(stack: ScaledStack) -> dict[str, dict[int, list[Any]]]:
    """trace id -> {gateway index: its spans} over what each gateway's store received."""
    traces: dict[str, dict[int, list[Any]]] = {}
    for index, store in enumerate(stack.stores):
        for _, span in store.collected.spans():
            traces.setdefault(span.trace_id.hex(), {}).setdefault(index, []).append(span)
    return traces


def roots(stack: ScaledStack) -> list[dict[str, Any]]:
    """Attributes (and status) of every kept llm.request."""
    found = []
    for store in stack.stores:
        for _, span in store.collected.spans():
            if span.name == sc.SPAN_REQUEST:
                found.append({**attributes(span.attributes), "error": span.status.code == 2})
    return found


def span_metric_calls(stack: ScaledStack, span_name: str) -> dict[str, float]:
    """gateway label -> span-metrics call count of ``span_name`` (all services)."""
    series = stack.promql(f'sum by (gateway) (traces_span_metrics_calls_total{{span_name="{span_name}"}})')
    return {s["metric"].get("gateway", ""): float(s["value"][1]) for s in series}


def test_agents_run_the_shipped_file_but_for_their_addresses_and_resolver(fleet: ScaledStack) -> None:
    assert fleet.agent_changes == {
        "receivers.otlp.protocols.grpc.endpoint",
        "receivers.otlp.protocols.http.endpoint",
        "exporters.load_balancing.resolver.dns",
        "exporters.load_balancing.resolver.static",
    }


def test_every_kept_trace_is_whole_on_exactly_one_gateway(fleet: ScaledStack) -> None:
    traces = kept(fleet)
    assert traces
    assert all(store.collected.spans() for store in fleet.stores), "routing sent every trace to one gateway"
    for trace_id, by_gateway in traces.items():
        assert len(by_gateway) == 1, f"{trace_id} reached gateways {sorted(by_gateway)}"
        (spans,) = by_gateway.values()
        (root,) = [s for s in spans if s.name == sc.SPAN_REQUEST]
        names = [s.name for s in spans]
        assert {sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE} <= set(names), trace_id
        preemptions = attributes(root.attributes)[sc.LLM_PREEMPTIONS]
        assert names.count(sc.SPAN_PREEMPTED) == names.count(sc.SPAN_RECOMPUTE) == preemptions, trace_id


def test_span_metrics_count_every_request_before_sampling(fleet: ScaledStack) -> None:
    calls = poll(
        "span metrics of every request in Prometheus",
        lambda: span_metric_calls(fleet, sc.SPAN_REQUEST),
        lambda c: sum(c.values()) >= 2 * REQUESTS,
        timeout_s=60,
    )
    assert sum(calls.values()) == 2 * REQUESTS
    assert set(calls) == {"gateway-0", "gateway-1"}


def test_tail_sampling_keeps_what_the_policies_say(fleet: ScaledStack) -> None:
    kept_roots = roots(fleet)
    # Every preemption span the gateways saw (span metrics count them before sampling) is in a kept trace.
    preempted = poll(
        "span metrics of the preemptions",
        lambda: sum(span_metric_calls(fleet, sc.SPAN_PREEMPTED).values()),
        lambda total: total > 0,
        timeout_s=60,
    )
    assert sum(r[sc.LLM_PREEMPTIONS] for r in kept_roots) == preempted
    # What no policy but the 2 % baseline keeps stays a small share of everything.
    rest = [
        r
        for r in kept_roots
        if not r["error"] and r[sc.LLM_PREEMPTIONS] == 0 and r.get(sc.LLM_LATENCY_TTFT, 0) <= SLOW_TTFT_S
    ]
    assert len(rest) <= 2, rest
