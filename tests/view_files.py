"""Traces files for the viewer's tests, written by a real RequestTracker through otel_llm's own OTLP JSON
file exporter (the one ``configure()`` uses without an endpoint), and what they hold, read back with
plain ``json`` rather than the viewer's own reader."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from otel_llm import RequestTracker
from otel_llm.export.otlp_json import OtlpJsonSpanExporter

T0 = 1000.0  # monotonic seconds the scenarios start from


def tracker_file(
    folder: Path,
    scenario: Callable[[RequestTracker], Any],
    resource: dict[str, str] | None = None,
    **tracker_options: Any,
) -> Path:
    """Run ``scenario`` on a tracker whose spans go to ``folder/traces.jsonl``; that file."""
    provider = TracerProvider(resource=Resource.create(resource or {}))
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonSpanExporter(folder)))
    tracker = RequestTracker(tracer_provider=provider, model="m", **tracker_options)
    scenario(tracker)
    provider.shutdown()
    return folder / "traces.jsonl"


def file_spans(path: Path) -> list[dict[str, Any]]:
    """Every span of an OTLP JSON lines file, as its JSON object, with ``attrs`` and ``resource`` (its
    resource's attributes) added as key -> value (an int as the string OTLP JSON writes)."""

    def values(items: list[dict[str, Any]]) -> dict[str, Any]:
        return {a["key"]: next(iter(a["value"].values())) for a in items}

    spans = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line).get("resourceSpans", []):
            resource = values(rs.get("resource", {}).get("attributes", []))
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    spans.append({**span, "attrs": values(span.get("attributes", [])), "resource": resource})
    return spans


def plain(lines: list[list[tuple[str, str | None]]]) -> list[str]:
    """render_lines' output as the text a terminal shows."""
    return ["".join(text for text, _ in line) for line in lines]
