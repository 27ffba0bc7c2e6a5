"""End to end: the engine's hook calls through a real RequestTracker into in-memory exporters give, for
each preempted request, llm.preempted and llm.recompute spans inside the phase the preemption hit, a
preemption counter equal to the scheduler's own count, and metrics that agree with the spans."""

from __future__ import annotations

from collections import Counter
from typing import Any

from engine_tools import Pipelines, SchedulerLog, run_to_completion, spy_scheduler

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.kit.engine import (
    METRIC_KV_BLOCKS_TOTAL,
    METRIC_KV_BLOCKS_USED,
    METRIC_STEP_TOKENS,
    EngineConfig,
    LLMEngine,
)
from otel_llm.kit.engine.telemetry import ATTR_DECODE_TOKENS, ATTR_PREFILL_TOKENS

PROMPTS = [("hello world", 20), ("a" * 13, 19), ("paged attention", 12), ("b" * 24, 6), ("kv", 25)]


def _points(p: Pipelines) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for rm in p.reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def _traced_run(p: Pipelines) -> tuple[LLMEngine, SchedulerLog, dict[str, Any], Any]:
    tracker = RequestTracker(tracer_provider=p.tracer_provider, meter_provider=p.meter_provider, model="tiny")
    config = EngineConfig(num_kv_blocks=10, block_size=4, max_num_batched_tokens=8, step_spans=True)
    engine = LLMEngine(
        config, tracker=tracker, tracer_provider=p.tracer_provider, meter_provider=p.meter_provider
    )
    log = spy_scheduler(engine)
    for prompt, max_tokens in PROMPTS:
        engine.add_request(prompt, max_tokens=max_tokens)
    produced = run_to_completion(engine)
    tracker.force_flush()
    return engine, log, produced, p.spans.get_finished_spans()


def test_every_span_nests_in_time_inside_its_parent(pipelines: Pipelines) -> None:
    """Also when a recompute is cut short by the next preemption before any token came."""
    _, log, _, spans = _traced_run(pipelines)
    assert len({rid for rid, _ in log.preemptions}) < len(log.preemptions), "expected repeated preemptions"
    by_id = {s.context.span_id: s for s in spans}
    for s in spans:
        if s.parent is not None and s.parent.span_id in by_id:
            parent = by_id[s.parent.span_id]
            assert parent.start_time <= s.start_time <= s.end_time <= parent.end_time, (s.name, parent.name)


def test_preemptions_become_spans_in_the_right_phase_and_metrics_agree(pipelines: Pipelines) -> None:
    p = pipelines
    engine, log, produced, spans = _traced_run(p)
    by_id = {s.context.span_id: s for s in spans}

    roots = {s.attributes[sc.LLM_REQUEST_ID]: s for s in spans if s.name == sc.SPAN_REQUEST}
    assert set(roots) == set(produced)
    phase_of_preemption = Counter(
        (rid, sc.SPAN_DECODE if outputs else sc.SPAN_PREFILL) for rid, outputs in log.preemptions
    )
    assert {phase for _, phase in phase_of_preemption} == {sc.SPAN_PREFILL, sc.SPAN_DECODE}
    for rid, root in roots.items():
        mine = [s for s in spans if s.context.trace_id == root.context.trace_id]
        for name in (sc.SPAN_PREEMPTED, sc.SPAN_RECOMPUTE):
            found = Counter((rid, by_id[s.parent.span_id].name) for s in mine if s.name == name)
            assert found == Counter({k: v for k, v in phase_of_preemption.items() if k[0] == rid}), (
                rid,
                name,
            )
        assert root.attributes[sc.LLM_PREEMPTIONS] == sum(1 for r, _ in log.preemptions if r == rid)
        assert root.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == len(produced[rid][0])

    points = _points(p)
    assert (
        sum(pt.value for pt in points[sc.METRIC_PREEMPTIONS])
        == engine.num_preemptions
        == len(log.preemptions)
    )
    output_tokens = sum(
        pt.value
        for pt in points[sc.METRIC_TOKENS]
        if pt.attributes[sc.GEN_AI_TOKEN_TYPE] == sc.TOKEN_TYPE_OUTPUT
    )
    assert output_tokens == sum(r.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] for r in roots.values())
    assert sum(pt.count for pt in points[sc.METRIC_TTFT]) == len(roots)

    # Engine step metrics agree with the step spans, and the step spans with the scheduler.
    steps = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP and s.attributes["llm.engine.batch_size"]]
    assert len(steps) == len(log.steps)
    (hist,) = points[METRIC_STEP_TOKENS]
    assert hist.count == len(steps)
    assert hist.sum == sum(
        s.attributes[ATTR_PREFILL_TOKENS] + s.attributes[ATTR_DECODE_TOKENS] for s in steps
    )
    assert hist.sum == sum(n for step in log.steps for _, n, _ in step)
    assert [pt.value for pt in points[METRIC_KV_BLOCKS_TOTAL]] == [10]
    assert [pt.value for pt in points[METRIC_KV_BLOCKS_USED]] == [0]  # nothing leaked

    # Each step span links to the request spans of the sequences it ran.
    root_ctx = {(r.context.trace_id, r.context.span_id): rid for rid, r in roots.items()}
    for step, scheduled in zip(steps, log.steps, strict=True):
        linked = sorted(root_ctx[(lk.context.trace_id, lk.context.span_id)] for lk in step.links)
        assert linked == sorted(rid for rid, _, _ in scheduled)
