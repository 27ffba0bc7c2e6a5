"""Request traces read back from OTLP JSON lines files (or in-memory spans), and a terminal waterfall.

The file format is the OpenTelemetry Collector file exporter's, also written by ``otel_llm.configure()``
with no endpoint: one JSON object per line with ``resourceSpans`` / ``scopeSpans`` / ``spans``, hex ids,
and times as ``startTimeUnixNano`` strings (epoch nanoseconds). Lines without spans (metrics) are skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from otel_llm import semconv

# The finish reason of a request the tracker gave up on (past max_age_s, or beyond max_in_flight): it never
# finished. Files written before the reason had a name of its own say "evicted", which meant the same.
REASON_ABANDONED = semconv.REASON_ABANDONED
_OLD_REASON_NAMES = {semconv.REASON_EVICTED: REASON_ABANDONED}


@dataclass(slots=True)
class SpanRecord:
    """One span as read back; times are epoch nanoseconds, ids lowercase hex."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace_id, span_id) of linked spans
    resource: dict[str, Any] = field(default_factory=dict)  # its resource's attributes (shared, not copied)
    # Its events: (name, epoch ns, attributes).
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass(slots=True)
class RequestTrace:
    """An ``llm.request`` span and every span below it."""

    root: SpanRecord
    spans: list[SpanRecord]  # descendants, in start order
    steps: int = 0  # llm.engine.step spans linked to this request, when step spans were on

    @property
    def request_id(self) -> str:
        return str(self.root.attributes.get(semconv.LLM_REQUEST_ID, self.root.span_id))

    @property
    def preemptions(self) -> int:
        """From the root's ``llm.preemptions`` (spans stop at a cap), else by counting spans."""
        counted = self.root.attributes.get(semconv.LLM_PREEMPTIONS)
        if isinstance(counted, (int, str)) and str(counted).isdigit():
            # A disaggregated request: the prefill instance counted its own preemptions on its span.
            for s in self.spans:
                if s.name == semconv.SPAN_INSTANCE_PREFILL:
                    counted = int(counted) + int(s.attributes.get(semconv.LLM_PREEMPTIONS, 0))
            return int(counted)
        return sum(1 for s in self.spans if s.name == semconv.SPAN_PREEMPTED)

    @property
    def finish_reasons(self) -> list[str]:
        """``gen_ai.response.finish_reasons`` of the root, an old file's ``evicted`` read as ``abandoned``."""
        reasons = self.root.attributes.get(semconv.GEN_AI_RESPONSE_FINISH_REASONS) or []
        if isinstance(reasons, str):
            reasons = [reasons]
        return [_OLD_REASON_NAMES.get(str(r), str(r)) for r in reasons]

    def children(self, parent: SpanRecord) -> list[SpanRecord]:
        return [s for s in self.spans if s.parent_id == parent.span_id]

    def events(self, name: str) -> list[tuple[int, dict[str, Any]]]:
        """(epoch ns, attributes) of every event called ``name`` on the root or below it, in time order."""
        found = [
            (at, attrs) for span in (self.root, *self.spans) for n, at, attrs in span.events if n == name
        ]
        return sorted(found, key=lambda event: event[0])


def _value(v: dict[str, Any]) -> Any:
    """An OTLP JSON AnyValue as a Python value (intValue arrives as a string, per the JSON mapping)."""
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    return None


def _attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {a["key"]: _value(a.get("value", {})) for a in items}


def _record(span: dict[str, Any], resource: dict[str, Any]) -> SpanRecord:
    return SpanRecord(
        trace_id=span["traceId"],
        span_id=span["spanId"],
        parent_id=span.get("parentSpanId") or None,
        name=span["name"],
        start_ns=int(span["startTimeUnixNano"]),
        end_ns=int(span["endTimeUnixNano"]),
        attributes=_attributes(span.get("attributes", [])),
        links=[(link["traceId"], link["spanId"]) for link in span.get("links", [])],
        resource=resource,
        events=[
            (e.get("name", ""), int(e.get("timeUnixNano", 0)), _attributes(e.get("attributes", [])))
            for e in span.get("events", [])
        ],
    )


def load_otlp_json(path: str | os.PathLike[str]) -> list[SpanRecord]:
    """Every span in an OTLP JSON lines file. Raises ValueError naming the file (and the line) when it
    is not OTLP JSON lines: a binary file, or a line that is not an OTLP traces request."""
    records: list[SpanRecord] = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                # A binary file (a database, a gzip, a wheel...): json's own message would name neither.
                raise ValueError(
                    f"{path}: not OTLP JSON lines (line {lineno} is not UTF-8 text); pass a traces.jsonl "
                    "written by otel_llm or by the Collector's file exporter, or its folder"
                ) from None
            if not line.strip():
                continue
            try:
                for rs in json.loads(line).get("resourceSpans", []):
                    resource = _attributes(rs.get("resource", {}).get("attributes", []))
                    for ss in rs.get("scopeSpans", []):
                        records += (_record(s, resource) for s in ss.get("spans", []))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ValueError(f"{path}:{lineno}: not an OTLP JSON traces line ({exc!r})") from exc
    return records


def from_readable_spans(spans: Iterable[Any]) -> list[SpanRecord]:
    """SpanRecords from SDK ``ReadableSpan`` objects (e.g. an InMemorySpanExporter's)."""
    out = []
    for s in spans:
        ctx = s.get_span_context()
        out.append(
            SpanRecord(
                trace_id=f"{ctx.trace_id:032x}",
                span_id=f"{ctx.span_id:016x}",
                parent_id=f"{s.parent.span_id:016x}" if s.parent is not None else None,
                name=s.name,
                start_ns=s.start_time,
                end_ns=s.end_time,
                attributes=dict(s.attributes or {}),
                links=[(f"{lk.context.trace_id:032x}", f"{lk.context.span_id:016x}") for lk in s.links],
                resource=dict(s.resource.attributes) if s.resource is not None else {},
                events=[(e.name, e.timestamp, dict(e.attributes or {})) for e in s.events],
            )
        )
    return out


def group_requests(records: Iterable[SpanRecord]) -> list[RequestTrace]:
    """One RequestTrace per ``llm.request`` span, in start order."""
    records = list(records)
    by_parent: dict[tuple[str, str], list[SpanRecord]] = {}
    for r in records:
        if r.parent_id:
            by_parent.setdefault((r.trace_id, r.parent_id), []).append(r)
    linked: dict[tuple[str, str], int] = {}
    for r in records:
        if r.name == semconv.SPAN_ENGINE_STEP:
            for link in r.links:
                linked[link] = linked.get(link, 0) + 1
    requests = []
    for root in (r for r in records if r.name == semconv.SPAN_REQUEST):
        below, todo = [], [root]
        while todo:
            todo += (kids := by_parent.get((root.trace_id, todo.pop().span_id), []))
            below += kids
        below.sort(key=lambda s: s.start_ns)
        requests.append(RequestTrace(root, below, linked.get((root.trace_id, root.span_id), 0)))
    requests.sort(key=lambda t: t.root.start_ns)
    return requests


def pick_request(
    requests: list[RequestTrace],
    request_id: str | None = None,
    slowest: bool = False,
    trace_id: str | None = None,
) -> RequestTrace:
    """The request with ``request_id`` (its latest run) or in ``trace_id`` (hex), the slowest, or else
    the most preempted."""
    if not requests:
        raise ValueError("no llm.request spans found; is this a traces file written by otel_llm?")
    if trace_id is not None:
        wanted = trace_id.strip().lower()
        matches = [t for t in requests if t.root.trace_id == wanted]
        if not matches:
            raise ValueError(
                f"no request in trace {trace_id!r}; trace ids look like {requests[0].root.trace_id!r}"
            )
        return matches[-1]
    if request_id is not None:
        matches = [t for t in requests if t.request_id == request_id]
        if not matches:
            raise ValueError(f"no request with id {request_id!r}; ids look like {requests[0].request_id!r}")
        return matches[-1]
    if slowest:
        return max(requests, key=lambda t: t.root.duration_s)
    return max(requests, key=lambda t: (t.preemptions, t.root.duration_s))
