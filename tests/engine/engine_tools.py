"""Helpers of the engine tests: a real engine with a scheduler spy, and real in-memory OTel pipelines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from metric_capture import MetricCapture
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm.kit.engine import EngineConfig, LLMEngine


@dataclass
class SchedulerLog:
    """What the scheduler decided, step by step, recorded by wrapping ``Scheduler.schedule``."""

    # (request id, tokens it had produced) for every preemption, in order
    preemptions: list[tuple[str, int]] = field(default_factory=list)
    # per step: [(request id, new tokens, was it prefilling)]
    steps: list[list[tuple[str, int, bool]]] = field(default_factory=list)


def spy_scheduler(engine: LLMEngine) -> SchedulerLog:
    log = SchedulerLog()
    schedule = engine.scheduler.schedule

    def recording_schedule() -> Any:
        batch = schedule()
        log.preemptions += [(s.request_id, s.num_output_tokens) for s in batch.preempted]
        if batch.seqs:
            log.steps.append(
                [
                    (s.request_id, n, s.is_prefill)
                    for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)
                ]
            )
        return batch

    engine.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    return log


def run_to_completion(engine: LLMEngine) -> dict[str, tuple[list[int], str | None]]:
    """Step until idle; each request's produced token ids and finish reason."""
    out: dict[str, tuple[list[int], str | None]] = {}
    while engine.has_unfinished():
        for o in engine.step():
            tokens, _ = out.get(o.request_id, ([], None))
            out[o.request_id] = (tokens + o.new_token_ids, o.finish_reason)
    return out


def tiny_engine(**kwargs: Any) -> LLMEngine:
    """Blocks of 4 tokens and an 8-token step budget: a few short requests already fill the cache."""
    config = {"num_kv_blocks": 10, "block_size": 4, "max_num_batched_tokens": 8, **kwargs}
    return LLMEngine(EngineConfig(**config))


@dataclass
class Pipelines:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    spans: InMemorySpanExporter
    reader: MetricCapture  # get_metrics_data() collects once, histograms included
