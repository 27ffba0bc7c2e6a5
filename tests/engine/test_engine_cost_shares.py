"""What each request cost the reference engine (docs/lifecycle.md, "Engine time"), checked against the
engine's own record of its steps.

The engine's side is read by spies, never from the tracker: a wrapper around ``Scheduler.schedule`` notes
which requests were re-admitted after a preemption, and one around the model runner notes, per step,
the tokens it fed each request and whether the step produced a token. Each step's start and end are
the engine's own ``llm.engine.step`` span. From those alone the test splits every step's time among its
requests by tokens, as the cost model says, and compares each request's sum with its ``llm.request``
span and the sum of all with the counter ``llm.server.engine.time``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from cost_model import shares
from engine_tools import Pipelines, run_to_completion

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.kit.engine import EngineConfig, LLMEngine
from otel_llm.kit.engine.telemetry import ATTR_BATCH_SIZE


@dataclass
class StepSeen:
    """One step as the engine ran it: tokens fed per request, which of them were recomputing, and
    whether any request got a token."""

    fed: dict[str, int]
    recomputing: set[str]
    produced: bool


@dataclass
class EngineSteps:
    steps: list[StepSeen] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)  # evicted, not re-admitted yet
    recomputing: set[str] = field(default_factory=set)  # re-admitted, no token since


def spy_steps(engine: LLMEngine) -> EngineSteps:
    seen = EngineSteps()
    schedule, run = engine.scheduler.schedule, engine.runner.run

    def recording_schedule() -> Any:
        batch = schedule()
        for seq in batch.preempted:
            seen.preempted.add(seq.request_id)
            seen.recomputing.discard(seq.request_id)
        for seq in batch.newly_scheduled:
            if seq.request_id in seen.preempted:
                seen.preempted.discard(seq.request_id)
                seen.recomputing.add(seq.request_id)
        return batch

    def recording_run(batch: Any) -> Any:
        tokens = run(batch)
        fed = {s.request_id: n for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)}
        seen.steps.append(StepSeen(fed, seen.recomputing & fed.keys(), any(t is not None for t in tokens)))
        for seq, token in zip(batch.seqs, tokens, strict=True):
            if token is not None:
                seen.recomputing.discard(seq.request_id)
        return tokens

    engine.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    engine.runner.run = recording_run  # type: ignore[method-assign]
    return seen


def expected_shares(
    seen: EngineSteps, spans: list[Any]
) -> tuple[dict[str, float], dict[str, float], float, float]:
    """Per request, its engine seconds and its recompute seconds under the cost model, from the engine's
    steps; and the busy time, by the model's step times and by the step spans themselves."""
    steps = sorted(
        (s for s in spans if s.name == sc.SPAN_ENGINE_STEP and s.attributes[ATTR_BATCH_SIZE] > 0),
        key=lambda s: s.start_time,
    )
    assert len(steps) == len(seen.steps), "one llm.engine.step span per step that ran"
    # The engine says where a step that produced no token (a prompt chunk) ended, too: tokens([]).
    timed = [(e.fed, s.start_time / 1e9, s.end_time / 1e9, e.recomputing) for s, e in zip(steps, seen.steps)]
    total, recompute, busy = shares(timed)
    spanned = sum((s.end_time - s.start_time) / 1e9 for s in steps)
    return total, recompute, busy, spanned


def workload(seed: int, n: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [
        ("".join(rng.choice("abcdefgh ") for _ in range(rng.randint(6, 40))), rng.randint(6, 30))
        for _ in range(n)
    ]


@pytest.fixture
def preempting_run(pipelines: Pipelines) -> tuple[EngineSteps, list[Any], dict[str, float]]:
    tracker = RequestTracker(
        tracer_provider=pipelines.tracer_provider, meter_provider=pipelines.meter_provider, model="tiny"
    )
    # A small KV cache (preemptions, recomputes) and a step budget that cuts the longer prompts in chunks.
    config = EngineConfig(num_kv_blocks=16, block_size=4, max_num_batched_tokens=24, step_spans=True)
    providers = {"tracer_provider": pipelines.tracer_provider, "meter_provider": pipelines.meter_provider}
    engine = LLMEngine(config, tracker=tracker, **providers)
    seen = spy_steps(engine)
    for k, (prompt, max_tokens) in enumerate(workload(11, 10)):
        engine.add_request(prompt, max_tokens=max_tokens, request_id=f"r{k}")
    run_to_completion(engine)
    tracker.force_flush()
    counter: dict[str, float] = {}
    for point in pipelines.reader.points(sc.METRIC_ENGINE_TIME):
        work = point.attributes[sc.LLM_ENGINE_WORK]
        counter[work] = counter.get(work, 0.0) + point.value
    return seen, list(pipelines.spans.get_finished_spans()), counter


def test_the_run_preempts_recomputes_and_chunks(preempting_run: Any) -> None:
    seen, _, _ = preempting_run
    assert any(step.recomputing for step in seen.steps), "a step that recomputes a preempted request"
    assert any(not step.produced for step in seen.steps), "a step that only fed a prompt chunk"
    assert any(len(step.fed) > 1 and max(step.fed.values()) > 1 for step in seen.steps), "a mixed step"


def test_each_requests_engine_time_is_its_share_of_the_engines_steps(preempting_run: Any) -> None:
    seen, spans, _ = preempting_run
    total, recompute, _, _ = expected_shares(seen, spans)
    roots = {s.attributes[sc.LLM_REQUEST_ID]: s.attributes for s in spans if s.name == sc.SPAN_REQUEST}
    assert set(roots) == set(total)
    for rid, attributes in roots.items():
        assert attributes[sc.LLM_ENGINE_TIME] == pytest.approx(total[rid], rel=1e-3, abs=1e-6), rid
        assert attributes[sc.LLM_ENGINE_TIME_RECOMPUTE] == pytest.approx(
            recompute.get(rid, 0.0), rel=1e-3, abs=1e-6
        ), rid
    assert sum(recompute.values()) > 0


def test_the_shares_sum_to_the_engines_busy_time(preempting_run: Any) -> None:
    seen, spans, counter = preempting_run
    _, recompute, busy, spanned = expected_shares(seen, spans)
    on_spans = sum(s.attributes[sc.LLM_ENGINE_TIME] for s in spans if s.name == sc.SPAN_REQUEST)
    # The model's busy time, and the engine's own: its step spans, one after the other.
    assert on_spans == pytest.approx(busy, rel=1e-3)
    assert on_spans == pytest.approx(spanned, rel=0.01)
    counted = counter[sc.ENGINE_WORK_COMPUTE] + counter[sc.ENGINE_WORK_RECOMPUTE]
    assert counted == pytest.approx(on_spans, rel=1e-6)
    assert counter[sc.ENGINE_WORK_RECOMPUTE] == pytest.approx(sum(recompute.values()), rel=1e-3)
