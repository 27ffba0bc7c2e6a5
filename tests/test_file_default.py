"""The embedded default: with no OTLP endpoint, configure() writes OTLP JSON lines files.

Every line must be what the OpenTelemetry Collector's ``otlpjsonfile`` receiver reads: one export request
in the OTLP/JSON encoding. The test checks that encoding's rules (camelCase keys, integer enums,
lowercase hex ids) on the raw JSON, then converts the ids back to the protobuf JSON mapping's base64, as
the specification describes, and parses each line with opentelemetry-proto's official messages through
``google.protobuf.json_format.Parse``.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_receivers import CALLER_TRACE_ID, attributes, drive_scenario
from span_keys import otlp_keys, sdk_keys

from otel_llm import semconv as sc
from otel_llm.export.otlp_json import OtlpJsonSpanExporter
from otel_llm.kit.commands.local_copy import tracker_with_local_copy
from otel_llm.setup import configure

# Every test here in both export modes (OTEL_LLM_EXPORT_MODE): configure()'s export process, and none.
pytestmark = pytest.mark.both_modes


@pytest.fixture(autouse=True)
def _export_mode(env: pytest.MonkeyPatch, export_mode: str) -> None:
    env.setenv("OTEL_LLM_EXPORT_MODE", export_mode)


HEX_LENGTH = {"traceId": 32, "spanId": 16, "parentSpanId": 16}


def hex_ids_to_base64(node: Any) -> Any:
    """OTLP/JSON -> protobuf JSON mapping: check each id is lowercase hex of the right size, re-encode it."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in HEX_LENGTH:
                assert re.fullmatch(f"[0-9a-f]{{{HEX_LENGTH[key]}}}", value), f"{key}={value!r} is not hex"
                node[key] = base64.b64encode(bytes.fromhex(value)).decode()
            else:
                hex_ids_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            hex_ids_to_base64(item)
    return node


def snake_case_keys(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [k for k in node if "_" in k and k != "key"]
        return own + [k for v in node.values() for k in snake_case_keys(v)]
    if isinstance(node, list):
        return [k for v in node for k in snake_case_keys(v)]
    return []


def parse_lines(path: Path, message_type: type[Message]) -> list[Any]:
    """Each line of an OTLP JSON lines file as the official protobuf message."""
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines, f"{path} is empty"
    messages = []
    for line in lines:
        tree = json.loads(line)
        assert snake_case_keys(tree) == [], "OTLP/JSON keys are camelCase"
        messages.append(json_format.Parse(json.dumps(hex_ids_to_base64(tree)), message_type()))
    return messages


def run_scenario_to_files() -> tuple[Path, Any, list[Any]]:
    telemetry = configure(service_name="file-engine", set_global=False)
    # A copy of the spans built in this process (in export mode process, from the export process's records).
    tracker, memory = tracker_with_local_copy(telemetry, model="file-model")
    counts = drive_scenario(tracker, time.monotonic() - 5.0)
    tracker.force_flush()
    assert telemetry.shutdown(timeout_s=30)
    assert telemetry.output_dir is not None
    return Path(telemetry.output_dir), counts, list(memory.get_finished_spans())


def test_no_endpoint_writes_valid_otlp_json_files(env, tmp_path: Path) -> None:
    directory, counts, in_memory = run_scenario_to_files()
    assert directory == tmp_path / "otel-llm-output"

    traces = parse_lines(directory / "traces.jsonl", ExportTraceServiceRequest)
    spans = [
        (rs.resource, span)
        for req in traces
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]
    assert sum(sdk_keys(in_memory).values()) == counts.spans
    assert otlp_keys([s for _, s in spans]) == sdk_keys(in_memory)  # the same spans, in the same tree
    kinds = {(s.name, s.kind) for _, s in spans}
    # SDK SpanKind starts at INTERNAL=0; OTLP reserves 0 for UNSPECIFIED.
    assert kinds == {(s.name, s.kind.value + 1) for s in in_memory}
    assert {attributes(r.attributes)["service.name"] for r, _ in spans} == {"file-engine"}
    assert CALLER_TRACE_ID in {s.trace_id.hex() for _, s in spans}
    preempted_events = [
        attributes(e.attributes)
        for _, s in spans
        if s.name == sc.SPAN_REQUEST
        for e in s.events
        if e.name == sc.EVENT_PREEMPTED
    ]
    assert [a[sc.LLM_OUTPUT_TOKENS] for a in preempted_events] == [2]

    metric_requests = parse_lines(directory / "metrics.jsonl", ExportMetricsServiceRequest)
    by_name: dict[str, Any] = {}
    for req in metric_requests:  # cumulative: the last export of each metric holds every sample
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    by_name[metric.name] = metric
    ttft = by_name[sc.METRIC_TTFT].histogram
    assert sum(p.count for p in ttft.data_points) == counts.with_first_token
    itl = by_name[sc.METRIC_ITL].histogram
    assert sum(p.count for p in itl.data_points) == counts.itl_samples
    # Exemplar ids went through the same hex encoding and still name this scenario's request spans.
    root_ids = {s.context.span_id.to_bytes(8, "big") for s in in_memory if s.name == sc.SPAN_REQUEST}
    assert {e.span_id for p in ttft.data_points for e in p.exemplars} <= root_ids


def test_raw_lines_use_integer_enums(env) -> None:
    """OTLP/JSON writes enums as their integer values (json_format.Parse, above, would take names too)."""
    directory, _, in_memory = run_scenario_to_files()
    # Each span's kind as the SDK built it (the local copy: in export mode process its span ids differ,
    # so spans are matched by name); OTLP's SpanKind counts from UNSPECIFIED = 0, the SDK's from INTERNAL = 0.
    kinds = [
        (span["name"], span["kind"])
        for line in (directory / "traces.jsonl").read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]
    # Every span: a name such as "SPAN_KIND_SERVER" would not be equal.
    assert Counter(kinds) == Counter((s.name, s.kind.value + 1) for s in in_memory)
    assert {type(kind) for _, kind in kinds} == {int}
    metrics = [
        m
        for line in (directory / "metrics.jsonl").read_text().splitlines()
        for rm in json.loads(line)["resourceMetrics"]
        for sm in rm["scopeMetrics"]
        for m in sm["metrics"]
    ]
    temporalities = [
        m[data]["aggregationTemporality"] for m in metrics for data in ("histogram", "sum") if data in m
    ]
    assert any("histogram" in m for m in metrics) and any("sum" in m for m in metrics), metrics
    # No temporality preference is set: every histogram and sum is cumulative (2), written as the integer.
    assert temporalities and {(type(t), t) for t in temporalities} == {(int, 2)}, temporalities


def test_output_dir_from_env(env, tmp_path: Path) -> None:
    env.setenv("OTEL_LLM_OUTPUT_DIR", str(tmp_path / "from-env"))
    directory, _, _ = run_scenario_to_files()
    assert directory == tmp_path / "from-env"
    assert (directory / "traces.jsonl").stat().st_size > 0
    assert (directory / "metrics.jsonl").stat().st_size > 0
    assert not (tmp_path / "otel-llm-output").exists()


def make_spans(count: int) -> list[Any]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("file-test")
    for i in range(count):
        with tracer.start_as_current_span(f"span-{i}"):
            pass
    return list(memory.get_finished_spans())


def test_unwritable_directory_returns_failure_logs_once_and_recovers(tmp_path: Path, caplog) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the output directory should be")
    exporter = OtlpJsonSpanExporter(blocker / "out")
    spans = make_spans(2)
    with caplog.at_level(logging.ERROR, logger="otel_llm"):
        assert exporter.export(spans) is SpanExportResult.FAILURE
        assert exporter.export(spans) is SpanExportResult.FAILURE
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1

    blocker.unlink()  # the disk problem goes away: the next batch is written
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert len(parse_lines(blocker / "out" / "traces.jsonl", ExportTraceServiceRequest)) == 1
    exporter.shutdown()
    assert exporter.export(spans) is SpanExportResult.FAILURE  # after shutdown, never reopened


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux /dev/full to make a disk-full error")
def test_disk_full_returns_failure_without_raising() -> None:
    exporter = OtlpJsonSpanExporter("/dev", filename="full")  # every write fails with ENOSPC
    assert exporter.export(make_spans(1)) is SpanExportResult.FAILURE
    exporter.shutdown()


def test_concurrent_exports_append_whole_lines(tmp_path: Path) -> None:
    exporter = OtlpJsonSpanExporter(tmp_path)
    batch = make_spans(20)
    threads, per_thread = 8, 25

    def worker() -> None:
        for _ in range(per_thread):
            assert exporter.export(batch) is SpanExportResult.SUCCESS

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    exporter.shutdown()
    requests = parse_lines(tmp_path / "traces.jsonl", ExportTraceServiceRequest)
    assert len(requests) == threads * per_thread
    assert all(len(r.resource_spans[0].scope_spans[0].spans) == len(batch) for r in requests)
