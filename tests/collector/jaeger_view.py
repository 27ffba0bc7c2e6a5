"""Compare a trace as Jaeger's query API shows it with the OTLP spans the Collector forwarded.

Jaeger's JSON (``/api/traces/<id>``) has microsecond times, tags for attributes, span kind and status,
logs for events and ``references`` for the parent. ``span_problems`` lists every difference, so a test
asserts an empty list and a failure names what differs.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

from tests.collector.processes import get_json, poll
from tests.otlp_receivers import attributes

KINDS = {
    trace_pb2.Span.SPAN_KIND_INTERNAL: "internal",
    trace_pb2.Span.SPAN_KIND_SERVER: "server",
    trace_pb2.Span.SPAN_KIND_CLIENT: "client",
    trace_pb2.Span.SPAN_KIND_PRODUCER: "producer",
    trace_pb2.Span.SPAN_KIND_CONSUMER: "consumer",
}


def tags(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in items}


def same_value(ours: Any, shown: Any) -> bool:
    if isinstance(ours, float):
        return isinstance(shown, (int, float)) and abs(ours - shown) <= 1e-9 * max(1.0, abs(ours))
    if isinstance(ours, list):  # Jaeger shows arrays as their JSON text
        return isinstance(shown, str) and shown.replace(" ", "") == str(ours).replace("'", '"').replace(
            " ", ""
        )
    return ours == shown


def span_problems(
    span: trace_pb2.Span, service: str, shown: dict[str, Any], processes: dict[str, Any]
) -> list[str]:
    """Every way Jaeger's view of ``span`` differs from the span itself."""
    name = span.name
    problems: list[str] = []
    if shown["operationName"] != name:
        problems.append(f"{name}: operation {shown['operationName']!r}")
    start_us = span.start_time_unix_nano // 1000
    if abs(shown["startTime"] - start_us) > 1:
        problems.append(f"{name}: start {shown['startTime']} != {start_us}")
    duration_us = (span.end_time_unix_nano - span.start_time_unix_nano) / 1000
    if abs(shown["duration"] - duration_us) > 1:
        problems.append(f"{name}: duration {shown['duration']} != {duration_us}")
    parents = {r["spanID"] for r in shown.get("references", []) if r["refType"] == "CHILD_OF"}
    expected_parent = {span.parent_span_id.hex()} if span.parent_span_id else set()
    if parents != expected_parent:
        problems.append(f"{name}: parent {parents} != {expected_parent}")
    shown_tags = tags(shown.get("tags", []))
    for key, value in attributes(span.attributes).items():
        if key not in shown_tags or not same_value(value, shown_tags[key]):
            problems.append(f"{name}: attribute {key}={value!r} shown as {shown_tags.get(key)!r}")
    kind = KINDS.get(span.kind)
    if shown_tags.get("span.kind") != kind:
        problems.append(f"{name}: kind {shown_tags.get('span.kind')!r} != {kind!r}")
    if span.status.code == trace_pb2.Status.STATUS_CODE_ERROR:
        if shown_tags.get("error") is not True or shown_tags.get("otel.status_code") != "ERROR":
            problems.append(f"{name}: ERROR status not shown ({shown_tags})")
    elif shown_tags.get("error"):
        problems.append(f"{name}: shown as an error")
    logs = sorted(shown.get("logs", []), key=lambda log: log["timestamp"])
    events = sorted(span.events, key=lambda e: e.time_unix_nano)
    if len(logs) != len(events):
        problems.append(f"{name}: {len(logs)} logs for {len(events)} events")
    for event, log in zip(events, logs):
        fields = tags(log["fields"])
        if fields.get("event") != event.name or abs(log["timestamp"] - event.time_unix_nano // 1000) > 1:
            problems.append(
                f"{name}: event {event.name} shown as {fields.get('event')} at {log['timestamp']}"
            )
        for key, value in attributes(event.attributes).items():
            if not same_value(value, fields.get(key)):
                problems.append(f"{name}: event {event.name} {key}={value!r} shown as {fields.get(key)!r}")
    shown_service = processes[shown["processID"]]["serviceName"]
    if shown_service != service:
        problems.append(f"{name}: service {shown_service!r} != {service!r}")
    return problems


def jaeger_trace(jaeger_url: str, trace_id: str, spans: int) -> dict[str, Any]:
    """The trace from Jaeger's query API once it holds ``spans`` spans (batching delays the last ones)."""
    url = f"{jaeger_url}/api/traces/{trace_id}"
    answer = poll(
        f"Jaeger to show trace {trace_id} with {spans} spans",
        lambda: get_json(url),
        lambda a: bool(a.get("data")) and len(a["data"][0]["spans"]) >= spans,
    )
    return answer["data"][0]


def trace_problems(jaeger_url: str, traces: dict[str, tuple[str, list[trace_pb2.Span]]]) -> list[str]:
    """Every difference between Jaeger's view and ``traces`` (trace id -> service name, spans)."""
    problems: list[str] = []
    for trace_id, (service, spans) in traces.items():
        shown = jaeger_trace(jaeger_url, trace_id, len(spans))
        by_id = {s["spanID"]: s for s in shown["spans"]}
        if set(by_id) != {s.span_id.hex() for s in spans}:
            expected = sorted(s.span_id.hex() for s in spans)
            problems.append(f"{trace_id}: Jaeger has spans {sorted(by_id)}, not {expected}")
            continue
        for span in spans:
            problems += span_problems(span, service, by_id[span.span_id.hex()], shown["processes"])
    return problems
