"""Plain-JSON records of what drive_scheduler.py collects: our spans and metric points, vLLM's stats.

Imported by drive_scheduler.py inside the vLLM virtualenv; it needs only the OpenTelemetry SDK.
"""

from __future__ import annotations

import sys
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult


class ListMetricExporter(MetricExporter):
    """Keeps exported batches in memory; behind PreAggregatedMetricExporter, as in production."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list = []

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        pass


def span_record(span) -> dict[str, Any]:
    """A finished span; start and end in wall-clock nanoseconds since the epoch, as the SDK keeps them."""
    parent = span.parent
    return {
        "name": span.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_id": None if parent is None else f"{parent.span_id:016x}",
        "start": span.start_time,
        "end": span.end_time,
        "status": span.status.status_code.name,
        "attributes": {k: _plain(v) for k, v in (span.attributes or {}).items()},
        "events": [
            {"name": e.name, "ts": e.timestamp, "attributes": {k: _plain(v) for k, v in e.attributes.items()}}
            for e in span.events
        ],
    }


def metric_records(data) -> list[dict[str, Any]]:
    """Every data point of one cumulative export, with its sum/count or value."""
    records = []
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    record = {
                        "name": metric.name,
                        "attributes": {k: _plain(v) for k, v in point.attributes.items()},
                    }
                    if hasattr(point, "bucket_counts"):
                        record.update(sum=point.sum, count=point.count)
                    else:
                        record.update(value=point.value)
                    records.append(record)
    return records


def vllm_record(stats) -> dict[str, Any]:
    """vLLM's FinishedRequestStats of one request; times in seconds."""
    return {
        "request_id": stats.request_id,
        "finish_reason": stats.finish_reason.name,
        "queued_time": stats.queued_time,
        "prefill_time": stats.prefill_time,
        "decode_time": stats.decode_time,
        "inference_time": stats.inference_time,
        "num_preemptions": stats.num_preemptions,
        "num_generation_tokens": stats.num_generation_tokens,
        "num_prompt_tokens": stats.num_prompt_tokens,
    }


def engine_timeline(timeline: dict[str, list], step: int, outputs, batch_ts: float) -> None:
    """Append what one batch of EngineCoreOutputs says about each request, as vLLM's engine core sent it.

    Entries are ``[kind, monotonic seconds, step the output arrived at, tokens]``: kind is an engine event
    (QUEUED, SCHEDULED, PREEMPTED; ``tokens`` 0) or TOKENS for the output's new tokens at the batch time.
    """
    for out in outputs:
        entries = timeline.setdefault(out.request_id, [])
        for event in out.events or []:
            entries.append([event.type.name, event.timestamp, step, 0])
        if out.new_token_ids:
            entries.append(["TOKENS", batch_ts, step, len(out.new_token_ids)])


def print_timelines(name: str, timeline: dict[str, list]) -> None:
    """Each request's engine-core timeline, times relative to the scenario's first event."""
    origin = min((ts for entries in timeline.values() for _, ts, *_ in entries), default=0.0)
    for rid, entries in timeline.items():
        ordered = sorted(entries, key=lambda e: e[1])
        text = ", ".join(
            f"{kind}{f'x{n}' if n else ''}@{(ts - origin) * 1e3:.3f}ms/s{step}"
            for kind, ts, step, n in ordered
        )
        print(f"{name} {rid}: {text}", file=sys.stderr)


def _plain(value):
    return list(value) if isinstance(value, tuple) else value
