"""collector-config/local/ run for real: otel-llm -> the Collector -> Jaeger v2 and Prometheus.

``otel-llm demo`` (a workload that preempts) and ``otel-llm serve`` (driven by the official ``openai``
client with a caller's ``traceparent``) export over OTLP/gRPC to the Collector loaded from
``collector-config/local/otelcol.yaml`` (addresses replaced, nothing else). What the tests read back is
what a user reads: Jaeger's query API (what its UI shows) and Prometheus's HTTP API (what Grafana asks).
The Collector's Tempo exporter feeds a real OTLP receiver of the tests, which records every span the
Collector forwarded: the reference Jaeger's view is compared with.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from otel_llm import semconv as sc
from tests.collector.jaeger_view import jaeger_trace, trace_problems
from tests.collector.local_stack import LOCAL, LocalStack
from tests.collector.processes import COLLECTOR, Proc, get_json, poll, validate
from tests.otlp_receivers import CALLER_SPAN_ID, CALLER_TRACE_ID, CALLER_TRACEPARENT, GrpcReceiver, attributes
from tests.ports import free_port
from tests.test_collector_config import (
    dashboard_queries,
    load_dashboard,
    metric_kinds,
    prometheus_metric_names,
)

CONFIG = LOCAL.parent
DEMO_SERVICE = "otel-llm-demo-collector"
SERVE_SERVICE = "otel-llm-serve-collector"
DEMO_REQUESTS = 24
SERVE_REQUESTS = 4
# Families otel-llm documents that this run cannot produce, and why (each still has its static check in
# tests/test_collector_config.py): a test that produced them would drop them from this table.
NOT_IN_THIS_RUN = {
    sc.METRIC_KV_TRANSFER: "only a disaggregated prefill/decode pair transfers KV caches",
    sc.METRIC_KV_TRANSFER_BYTES: "only a disaggregated prefill/decode pair transfers KV caches",
    sc.METRIC_SPEC_DRAFT_TOKENS: "the reference engine does not decode speculatively",
    sc.METRIC_SPEC_ACCEPTED_TOKENS: "the reference engine does not decode speculatively",
    sc.METRIC_SAMPLING_DECISIONS: "in-process tail sampling is off by default",
    sc.METRIC_ANOMALIES: "a healthy engine reports no anomaly",
}


# --- validate: every file as shipped ----------------------------------------------------------------


@pytest.mark.parametrize(
    "files",
    [
        ["local/otelcol.yaml"],
        ["local/otelcol.yaml", "local/otelcol-tls.yaml"],
        ["scaled/agent.yaml"],
        ["scaled/gateway.yaml"],
    ],
    ids=lambda files: "+".join(files),
)
def test_collector_validate_accepts_the_shipped_file(files: list[str]) -> None:
    # HOSTNAME: the gateway's `gateway` label; Kubernetes sets it to the pod name (scaled/README.md).
    done = validate([CONFIG / f for f in files], env={"HOSTNAME": "otel-gateway-0"})
    assert done.returncode == 0, done.stdout + done.stderr


def test_gateway_needs_its_hostname_for_the_gateway_label() -> None:
    env = {k: v for k, v in os.environ.items() if k != "HOSTNAME"}
    done = subprocess.run(
        [str(COLLECTOR), "validate", f"--config={CONFIG / 'scaled/gateway.yaml'}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode != 0 and "external labels" in done.stdout + done.stderr


def test_collector_validate_refuses_a_misspelt_component(tmp_path: Path) -> None:
    broken = tmp_path / "otelcol.yaml"
    broken.write_text(
        (CONFIG / "local/otelcol.yaml").read_text().replace("memory_limiter", "memory_limitter")
    )
    done = validate([broken])
    assert done.returncode != 0 and "memory_limitter" in done.stdout + done.stderr


# --- the stack and the runs ---------------------------------------------------------------------------


@dataclass
class Runs:
    stack: LocalStack
    tempo: GrpcReceiver  # what the Collector forwarded to its Tempo exporter
    serve_trace_ids: list[str]  # x-trace-id of each request served


def otel_env(stack: LocalStack, service: str, metric_export_ms: int = 1000) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=stack.otlp_grpc,
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_SERVICE_NAME=service,
        OTEL_METRIC_EXPORT_INTERVAL=str(metric_export_ms),
    )
    return env


# The demo exports its metrics once, when it exits. A point carries only the exemplars recorded since
# the previous export (as the SDK's reservoirs do), and the Collector's Prometheus exporter serves the
# latest point of a series: with periodic exports, an export after the last request would leave
# nothing for a 10 s scrape to find unless a scrape happened to fall inside the run.
DEMO_METRIC_EXPORT_MS = 600_000


def run_serve(stack: LocalStack, work: Path) -> list[str]:
    """``otel-llm serve`` answering the openai client, each request under the caller's span."""
    import openai

    port = free_port()
    argv = [sys.executable, "-m", "otel_llm.kit.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    proc = Proc("serve", [*argv, "--log-level", "warning"], work, otel_env(stack, SERVE_SERVICE))
    trace_ids = []
    try:
        proc.wait_ready(f"http://127.0.0.1:{port}/health")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=60)
        for i in range(SERVE_REQUESTS):
            raw = client.completions.with_raw_response.create(
                model="otel-llm-tiny",
                prompt=f"hello {i}",
                max_tokens=8,
                extra_headers={"traceparent": CALLER_TRACEPARENT} if i == 0 else None,
            )
            raw.parse()
            trace_ids.append(raw.headers["x-trace-id"])
    finally:
        proc.stop(timeout_s=30)  # SIGTERM: the server flushes its telemetry before it exits
    return trace_ids


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    work = tmp_path_factory.mktemp("local-stack")
    tempo = GrpcReceiver()
    tempo.start()
    stack = None
    try:
        stack = LocalStack(work, tempo.port)
        demo = subprocess.run(
            [sys.executable, "-m", "otel_llm.kit.cli", "demo", "--requests", str(DEMO_REQUESTS)],
            cwd=work,
            env=otel_env(stack, DEMO_SERVICE, DEMO_METRIC_EXPORT_MS),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert demo.returncode == 0, demo.stdout + demo.stderr
        serve_ids = run_serve(stack, work)
        assert tempo.collected.wait_until(
            lambda c: len(request_spans(c)) == DEMO_REQUESTS + SERVE_REQUESTS, timeout_s=60
        ), f"the Collector forwarded {len(request_spans(tempo.collected))} llm.request spans"
        yield Runs(stack, tempo, serve_ids)
    finally:
        if stack is not None:
            stack.stop()
        tempo.stop()


def request_spans(collected: Any) -> list[tuple[Any, Any]]:
    return [(r, s) for r, s in collected.spans() if s.name == sc.SPAN_REQUEST]


def forwarded_traces(runs: Runs) -> dict[str, tuple[str, list[Any]]]:
    """trace id (hex) -> (service name, its spans), as the Collector forwarded them."""
    traces: dict[str, tuple[str, list[Any]]] = {}
    for resource, span in runs.tempo.collected.spans():
        service = attributes(resource.attributes)["service.name"]
        traces.setdefault(span.trace_id.hex(), (service, []))[1].append(span)
    return traces


# --- Jaeger --------------------------------------------------------------------------------------------


def test_jaeger_shows_every_trace_whole_and_as_exported(runs: Runs) -> None:
    traces = forwarded_traces(runs)
    services = {service for service, _ in traces.values()}
    assert services == {DEMO_SERVICE, SERVE_SERVICE}
    assert trace_problems(runs.stack.jaeger_url, traces) == []  # waits for each trace to arrive whole
    assert set(get_json(f"{runs.stack.jaeger_url}/api/services")["data"]) >= services


def test_jaeger_tree_has_the_phases_and_a_pair_of_spans_per_preemption(runs: Runs) -> None:
    preempted = 0
    for trace_id, (_, spans) in forwarded_traces(runs).items():
        shown = jaeger_trace(runs.stack.jaeger_url, trace_id, len(spans))
        (root,) = [s for s in shown["spans"] if s["operationName"] == sc.SPAN_REQUEST]
        children = [s["operationName"] for s in shown["spans"] if root["spanID"] in parent_ids(s)]
        assert {sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE} <= set(children), (trace_id, children)
        # Each preemption: an llm.preempted and an llm.recompute span inside the phase it interrupted.
        count = {t["key"]: t["value"] for t in root["tags"]}[sc.LLM_PREEMPTIONS]
        phases = {s["spanID"] for s in shown["spans"] if root["spanID"] in parent_ids(s)}
        inside = [s["operationName"] for s in shown["spans"] if parent_ids(s) & phases]
        assert inside.count(sc.SPAN_PREEMPTED) == inside.count(sc.SPAN_RECOMPUTE) == count, trace_id
        preempted += count > 0
    assert preempted > 0, "the demo workload is sized to preempt"


def parent_ids(span: dict[str, Any]) -> set[str]:
    return {r["spanID"] for r in span.get("references", []) if r["refType"] == "CHILD_OF"}


def test_jaeger_search_finds_exactly_the_preempted_requests(runs: Runs) -> None:
    # As collector-config/README.md tells a user: service, then operation `llm.preempted`.
    expected = {
        span.trace_id.hex()
        for resource, span in request_spans(runs.tempo.collected)
        if attributes(span.attributes)[sc.LLM_PREEMPTIONS] > 0
    }
    assert expected
    params = {"service": DEMO_SERVICE, "operation": sc.SPAN_PREEMPTED, "limit": "1000", "lookback": "1h"}
    found = get_json(f"{runs.stack.jaeger_url}/api/traces", params)["data"]
    assert {t["traceID"] for t in found} == expected
    # The tag search of the same page, on the root span's attribute.
    params = {"service": DEMO_SERVICE, "tags": json.dumps({sc.LLM_PREEMPTIONS: "0"}), "limit": "1000"}
    not_preempted = {t["traceID"] for t in get_json(f"{runs.stack.jaeger_url}/api/traces", params)["data"]}
    assert not_preempted and not_preempted.isdisjoint(expected)


def test_jaeger_shows_a_served_request_under_the_callers_span(runs: Runs) -> None:
    assert runs.serve_trace_ids[0] == CALLER_TRACE_ID
    assert len(set(runs.serve_trace_ids)) == SERVE_REQUESTS
    for trace_id in runs.serve_trace_ids:
        shown = jaeger_trace(runs.stack.jaeger_url, trace_id, 4)
        (root,) = [s for s in shown["spans"] if s["operationName"] == sc.SPAN_REQUEST]
        assert shown["processes"][root["processID"]]["serviceName"] == SERVE_SERVICE
        # Only the first request came with the caller's traceparent.
        assert parent_ids(root) == ({CALLER_SPAN_ID} if trace_id == CALLER_TRACE_ID else set())


# --- Prometheus ----------------------------------------------------------------------------------------


def scraped(runs: Runs) -> LocalStack:
    """The stack once Prometheus holds two scrapes of every request's metrics (rate() needs two)."""
    stack = runs.stack
    expr = 'count_over_time(gen_ai_server_time_to_first_token_seconds_count{job="%s"}[10m])'
    total = 'sum(gen_ai_server_time_to_first_token_seconds_count{job="%s"})'
    poll(
        "Prometheus to scrape every request twice",
        lambda: (stack.promql(expr % DEMO_SERVICE), stack.promql(total % DEMO_SERVICE)),
        lambda r: (
            bool(r[0]) and float(r[0][0]["value"][1]) >= 2 and float(r[1][0]["value"][1]) == DEMO_REQUESTS
        ),
        timeout_s=90,
    )
    return stack


def test_prometheus_has_every_documented_family_under_the_documented_name(runs: Runs) -> None:
    stack = scraped(runs)
    missing, unexpected = [], []
    for name, (kind, unit) in metric_kinds().items():
        for series in sorted(prometheus_metric_names(name, kind, unit)):
            present = bool(stack.promql(f'count({{__name__="{series}", job="{DEMO_SERVICE}"}})'))
            if name in NOT_IN_THIS_RUN and present:
                unexpected.append(series)
            elif name not in NOT_IN_THIS_RUN and not present:
                missing.append(series)
    assert (missing, unexpected) == ([], [])


def prometheus_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's histogram_quantile over cumulative (upper bound, count) pairs, +Inf last."""
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return math.nan


def test_ttft_buckets_and_quantile_match_what_otel_llm_exported(runs: Runs) -> None:
    stack = scraped(runs)
    ttfts = [
        attributes(span.attributes)[sc.LLM_LATENCY_TTFT]
        for resource, span in request_spans(runs.tempo.collected)
        if attributes(resource.attributes)["service.name"] == DEMO_SERVICE
    ]
    assert len(ttfts) == DEMO_REQUESTS
    series = stack.promql(f'gen_ai_server_time_to_first_token_seconds_bucket{{job="{DEMO_SERVICE}"}}')
    buckets = sorted((float(s["metric"]["le"]), float(s["value"][1])) for s in series)
    assert len(buckets) > 2 and math.isinf(buckets[-1][0])
    assert buckets == [(le, float(sum(t <= le for t in ttfts))) for le, _ in buckets]
    for q in (0.5, 0.9, 0.99):
        ttft = f'gen_ai_server_time_to_first_token_seconds_bucket{{job="{DEMO_SERVICE}"}}'
        (answer,) = stack.promql(f"histogram_quantile({q}, sum by (le) ({ttft}))")
        assert float(answer["value"][1]) == pytest.approx(prometheus_quantile(q, buckets), rel=1e-9)


def test_exemplars_name_traces_that_jaeger_has(runs: Runs) -> None:
    stack = scraped(runs)
    now = time.time()
    answer = get_json(
        f"{stack.prometheus_url}/api/v1/query_exemplars",
        {
            "query": f'gen_ai_server_time_to_first_token_seconds_bucket{{job="{DEMO_SERVICE}"}}',
            "start": str(now - 3600),
            "end": str(now + 60),
        },
    )
    trace_ids = {e["labels"]["trace_id"] for group in answer["data"] for e in group["exemplars"]}
    assert trace_ids, answer
    demo_traces = {t for t, (service, _) in forwarded_traces(runs).items() if service == DEMO_SERVICE}
    assert trace_ids <= demo_traces
    for trace_id in trace_ids:
        assert get_json(f"{stack.jaeger_url}/api/traces/{trace_id}")["data"], trace_id


def test_every_dashboard_expression_returns_data(runs: Runs) -> None:
    stack = scraped(runs)
    promql, _ = dashboard_queries(load_dashboard())
    absent = {
        series for name in NOT_IN_THIS_RUN for series in prometheus_metric_names(name, *metric_kinds()[name])
    }
    empty = []
    for expr in promql:
        query = expr.replace("$job", ".*").replace("$model", ".*").replace("$__rate_interval", "5m")
        if any(series in query for series in absent):
            continue
        if not stack.promql(query):
            empty.append(query)
    assert empty == []
