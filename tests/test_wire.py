"""Wire tests: requests go through ``configure()`` (environment variables only) to real OTLP receivers.

Each receiver is a real server on loopback (gRPC or HTTP/protobuf) that decodes what arrives with the
official opentelemetry-proto messages. An in-memory span exporter on the same tracer provider gives the
spans as the SDK made them, so the test can check that exactly those spans crossed the wire, and the
lifecycle contract gives the structure and the metric counts.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from otlp_receivers import (
    CALLER_SPAN_ID,
    CALLER_TRACE_ID,
    Collected,
    GrpcReceiver,
    HttpReceiver,
    ScenarioCounts,
    attributes,
    drive_scenario,
)
from span_keys import otlp_keys, sdk_keys

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.export.telemetry import Telemetry
from otel_llm.kit.commands.local_copy import tracker_with_local_copy
from otel_llm.setup import configure

# Every test here in both export modes (OTEL_LLM_EXPORT_MODE): configure()'s export process, and none.
pytestmark = pytest.mark.both_modes


@pytest.fixture(autouse=True)
def _export_mode(env: pytest.MonkeyPatch, export_mode: str) -> None:
    env.setenv("OTEL_LLM_EXPORT_MODE", export_mode)


PROTOCOLS = [
    pytest.param(GrpcReceiver, "grpc", id="grpc"),
    pytest.param(HttpReceiver, "http/protobuf", id="http"),
]
MODEL = "wire-model"


def start(started: list[Any], receiver_type: type) -> Any:
    receiver = receiver_type()
    receiver.start()
    started.append(receiver)
    return receiver


def run_scenario(started: list[Any]) -> tuple[Telemetry, ScenarioCounts, list[Any]]:
    """configure() from the environment, drive the scenario, flush; return an in-memory copy of the spans
    too, built in this process (in export mode process, from the same records as the export process's)."""
    telemetry = configure(service_name="name-from-code", set_global=False)
    started.append(telemetry)
    tracker, memory = tracker_with_local_copy(telemetry, model=MODEL)
    counts = drive_scenario(tracker, time.monotonic() - 5.0)
    tracker.force_flush()
    assert telemetry.force_flush(timeout_s=30)
    return telemetry, counts, list(memory.get_finished_spans())


def point_env(env: pytest.MonkeyPatch, receiver: Any, protocol: str) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)


def last_histogram(collected: Collected, name: str) -> metrics_pb2.Histogram:
    found = collected.metrics(name)
    assert found, f"{name} never arrived"
    metric = found[-1][1]
    assert metric.WhichOneof("data") == "histogram", f"{name} arrived as {metric.WhichOneof('data')}"
    return metric.histogram


def histogram_count(collected: Collected, name: str) -> int:
    found = collected.metrics(name)
    return sum(p.count for p in found[-1][1].histogram.data_points) if found else -1


def by_request_id(spans: list[trace_pb2.Span]) -> dict[str, trace_pb2.Span]:
    roots = [s for s in spans if s.name == sc.SPAN_REQUEST]
    return {attributes(s.attributes)[sc.LLM_REQUEST_ID]: s for s in roots}


def children(spans: list[trace_pb2.Span], parent: trace_pb2.Span) -> dict[str, list[trace_pb2.Span]]:
    out: dict[str, list[trace_pb2.Span]] = {}
    for span in spans:
        if span.trace_id == parent.trace_id and span.parent_span_id == parent.span_id:
            out.setdefault(span.name, []).append(span)
    return out


@pytest.mark.parametrize(("receiver_type", "protocol"), PROTOCOLS)
def test_spans_resource_and_events_arrive(env, started, receiver_type, protocol) -> None:
    receiver = start(started, receiver_type)
    point_env(env, receiver, protocol)
    env.setenv("OTEL_SERVICE_NAME", "wire-engine")
    env.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=wire-test,service.name=loses-to-env")

    telemetry, counts, in_memory = run_scenario(started)
    assert receiver.collected.wait_until(lambda c: len(c.spans()) >= counts.spans)
    received = receiver.collected.spans()

    # The spans of the copy made in this process crossed the wire, in the same tree and times.
    assert sum(sdk_keys(in_memory).values()) == counts.spans
    assert otlp_keys([s for _, s in received]) == sdk_keys(in_memory)
    if telemetry.export_mode == "in_process":
        # Built and exported by this process: the very same spans, the children's ids too.
        def key(trace_id: bytes, span_id: bytes, parent: bytes, name: str, start: int, end: int) -> tuple:
            return trace_id.hex(), span_id.hex(), parent.hex(), name, start, end

        sent = {
            key(
                s.context.trace_id.to_bytes(16, "big"),
                s.context.span_id.to_bytes(8, "big"),
                s.parent.span_id.to_bytes(8, "big") if s.parent else b"",
                s.name,
                s.start_time,
                s.end_time,
            )
            for s in in_memory
        }
        got = {
            key(s.trace_id, s.span_id, s.parent_span_id, s.name, s.start_time_unix_nano, s.end_time_unix_nano)
            for _, s in received
        }
        assert got == sent

    for resource, _ in received:
        res = attributes(resource.attributes)
        assert res["service.name"] == "wire-engine"  # OTEL_SERVICE_NAME beats both other sources
        assert res["deployment.environment.name"] == "wire-test"

    spans = [s for _, s in received]
    roots = by_request_id(spans)
    assert sorted(roots) == ["r1", "r2", "r3"]
    for rid, root in roots.items():
        phases = children(spans, root)
        assert sorted(phases) == sorted([sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE]), rid
        assert all(len(v) == 1 for v in phases.values()), rid
    assert roots["r1"].kind == trace_pb2.Span.SPAN_KIND_SERVER
    assert roots["r1"].parent_span_id == b""

    # r2 was preempted after its first token: the eviction and the recompute nest under decode.
    decode = children(spans, roots["r2"])[sc.SPAN_DECODE][0]
    under_decode = children(spans, decode)
    assert sorted(under_decode) == sorted([sc.SPAN_PREEMPTED, sc.SPAN_RECOMPUTE])
    assert children(spans, children(spans, roots["r2"])[sc.SPAN_PREFILL][0]) == {}

    # r3 joined the caller's trace under the caller's span.
    assert roots["r3"].trace_id.hex() == CALLER_TRACE_ID
    assert roots["r3"].parent_span_id.hex() == CALLER_SPAN_ID

    events = [(e.name, attributes(e.attributes)) for e in roots["r2"].events]
    names = [name for name, _ in events]
    assert names.count(sc.EVENT_QUEUED) == 1
    assert names.count(sc.EVENT_FIRST_TOKEN) == 1
    scheduled = [a for n, a in events if n == sc.EVENT_SCHEDULED]
    assert [a.get(sc.LLM_RESUMED, False) for a in scheduled] == [False, True]
    assert [a[sc.LLM_OUTPUT_TOKENS] for n, a in events if n == sc.EVENT_PREEMPTED] == [2]
    root_attrs = attributes(roots["r1"].attributes)
    assert root_attrs[sc.GEN_AI_REQUEST_MODEL] == MODEL
    assert root_attrs["gen_ai.request.max_tokens"] == 16


@pytest.mark.parametrize(("receiver_type", "protocol"), PROTOCOLS)
def test_metrics_arrive(env, started, receiver_type, protocol) -> None:
    receiver = start(started, receiver_type)
    point_env(env, receiver, protocol)
    env.setenv("OTEL_SERVICE_NAME", "wire-engine")

    _, counts, in_memory = run_scenario(started)
    rx = receiver.collected
    assert rx.wait_until(lambda c: histogram_count(c, sc.METRIC_TTFT) == counts.with_first_token)
    assert rx.wait_until(lambda c: histogram_count(c, sc.METRIC_ITL) == counts.itl_samples)

    ttft = last_histogram(rx, sc.METRIC_TTFT)
    assert ttft.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    point_attrs = attributes(ttft.data_points[0].attributes)
    assert point_attrs[sc.GEN_AI_REQUEST_MODEL] == MODEL
    assert sc.LLM_REQUEST_ID not in point_attrs  # metrics stay low-cardinality
    # Exemplars, where the SDK kept them, point at this scenario's request spans.
    root_ids = {s.context.span_id.to_bytes(8, "big") for s in in_memory if s.name == sc.SPAN_REQUEST}
    exemplar_ids = {e.span_id for p in ttft.data_points for e in p.exemplars}
    assert exemplar_ids <= root_ids

    itl = last_histogram(rx, sc.METRIC_ITL)
    assert list(itl.data_points[0].explicit_bounds) == list(sc.BUCKETS_ITL)
    assert sum(sum(p.bucket_counts) for p in itl.data_points) == counts.itl_samples

    preemptions = rx.metrics(sc.METRIC_PREEMPTIONS)[-1][1]
    assert sum(p.as_int for p in preemptions.sum.data_points) == counts.preemptions
    for resource, _ in rx.metrics():
        assert attributes(resource.attributes)["service.name"] == "wire-engine"


@pytest.mark.parametrize(("receiver_type", "protocol"), PROTOCOLS)
def test_delta_temporality_preference_is_respected(env, started, receiver_type, protocol) -> None:
    receiver = start(started, receiver_type)
    point_env(env, receiver, protocol)
    env.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")

    _, counts, _ = run_scenario(started)
    rx = receiver.collected

    def delta_total(c: Collected, name: str) -> int:  # deltas add up across exports
        return sum(p.count for _, m in c.metrics(name) for p in m.histogram.data_points)

    assert rx.wait_until(lambda c: delta_total(c, sc.METRIC_ITL) == counts.itl_samples)
    assert delta_total(rx, sc.METRIC_TTFT) == counts.with_first_token
    for name in (sc.METRIC_TTFT, sc.METRIC_ITL):
        for _, metric in rx.metrics(name):
            assert metric.histogram.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_DELTA


@pytest.mark.parametrize(("receiver_type", "protocol"), PROTOCOLS)
def test_headers_and_compression_from_env(env, started, receiver_type, protocol) -> None:
    receiver = start(started, receiver_type)
    point_env(env, receiver, protocol)
    env.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=acme,x-scope=llm%20serving")
    env.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")

    _, counts, _ = run_scenario(started)
    rx = receiver.collected
    assert rx.wait_until(lambda c: len(c.spans()) >= counts.spans and bool(c.received("metrics")))
    for item in rx.received():
        assert item.headers.get("x-tenant") == "acme", item.signal
        assert item.headers.get("x-scope") == "llm serving", item.signal
        if protocol == "http/protobuf":
            assert item.headers.get("content-encoding") == "gzip"


def test_http_per_signal_endpoint_is_used_as_is(env, started) -> None:
    receiver = start(started, HttpReceiver)
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)  # base URL: /v1/metrics is appended
    env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{receiver.endpoint}/custom/traces")  # as given

    _, counts, _ = run_scenario(started)
    rx = receiver.collected
    assert rx.wait_until(lambda c: len(c.spans()) >= counts.spans and bool(c.received("metrics")))
    assert {r.path for r in rx.received("traces")} == {"/custom/traces"}
    assert {r.path for r in rx.received("metrics")} == {"/v1/metrics"}


def test_per_signal_protocols_send_traces_and_metrics_to_different_collectors(env, started) -> None:
    grpc_rx = start(started, GrpcReceiver)
    http_rx = start(started, HttpReceiver)
    env.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", grpc_rx.endpoint)
    env.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf")
    env.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", f"{http_rx.endpoint}/v1/metrics")

    telemetry, counts, _ = run_scenario(started)
    assert grpc_rx.collected.wait_until(lambda c: len(c.spans()) >= counts.spans)
    assert http_rx.collected.wait_until(
        lambda c: histogram_count(c, sc.METRIC_TTFT) == counts.with_first_token
    )
    assert telemetry.shutdown(timeout_s=30)
    assert grpc_rx.collected.received("metrics") == []
    assert http_rx.collected.received("traces") == []


def test_sampler_from_env_drops_spans_but_not_metrics(env, started) -> None:
    receiver = start(started, HttpReceiver)
    point_env(env, receiver, "http/protobuf")
    env.setenv("OTEL_TRACES_SAMPLER", "always_off")

    telemetry, counts, in_memory = run_scenario(started)
    assert telemetry.shutdown(timeout_s=30)  # everything that was going to leave has left
    assert in_memory == []
    assert receiver.collected.received("traces") == []
    assert histogram_count(receiver.collected, sc.METRIC_TTFT) == counts.with_first_token


def test_traces_exporter_none_sends_no_traces(env, started) -> None:
    receiver = start(started, GrpcReceiver)
    point_env(env, receiver, "grpc")
    env.setenv("OTEL_TRACES_EXPORTER", "none")

    telemetry, counts, in_memory = run_scenario(started)
    assert telemetry.shutdown(timeout_s=30)
    assert len(in_memory) == counts.spans  # spans were made, just not exported
    assert receiver.collected.received("traces") == []
    assert histogram_count(receiver.collected, sc.METRIC_TTFT) == counts.with_first_token


def test_default_protocol_is_http_protobuf(env, started) -> None:
    receiver = start(started, HttpReceiver)
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)  # no protocol variable at all

    _, counts, _ = run_scenario(started)
    assert receiver.collected.wait_until(lambda c: len(c.spans()) >= counts.spans)
    assert {r.path for r in receiver.collected.received("traces")} == {"/v1/traces"}


def test_metric_export_interval_from_env(env, started) -> None:
    receiver = start(started, GrpcReceiver)
    point_env(env, receiver, "grpc")
    env.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")  # ms; the SDK default (60 s) would outlast the wait
    telemetry = configure(set_global=False)
    started.append(telemetry)
    tracker = RequestTracker(
        tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
    )
    counts = drive_scenario(tracker, time.monotonic() - 5.0)  # no flush: the periodic reader must send it
    assert receiver.collected.wait_until(
        lambda c: histogram_count(c, sc.METRIC_TTFT) == counts.with_first_token
    )


def test_traces_exporter_file_keeps_traces_local_while_metrics_go_out(env, started, tmp_path) -> None:
    receiver = start(started, GrpcReceiver)
    point_env(env, receiver, "grpc")
    env.setenv("OTEL_TRACES_EXPORTER", "file")
    env.setenv("OTEL_LLM_OUTPUT_DIR", str(tmp_path))

    telemetry, counts, _ = run_scenario(started)
    assert telemetry.shutdown(timeout_s=30)
    assert receiver.collected.received("traces") == []
    assert histogram_count(receiver.collected, sc.METRIC_TTFT) == counts.with_first_token
    assert (tmp_path / "traces.jsonl").stat().st_size > 0
    assert not (tmp_path / "metrics.jsonl").exists()
