"""What a preemption cost in work, through a user's own SDK providers (InMemorySpanExporter, the SDK's
InMemoryMetricReader): the cached tokens an engine reports when it reschedules a preempted request, the
tokens it recomputes (prompt + output so far - cached), on each ``llm.recompute`` span, summed on
``llm.request`` and counted by ``llm.server.recompute.*``; and the prompt tokens by source from
``engine_state()``.

Every expected figure is computed here from the calls the test makes (the prompt's length, the tokens
given before each preemption, the cached figure passed at each rescheduling), never read back from
otel_llm's own output.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.hooks import anomalies as an
from otel_llm.record import MAX_PREEMPTION_SPANS

# Every test here in both export modes: the engine's process, and the export process beside it.
pytestmark = pytest.mark.both_modes

STEP = 0.01


@dataclass
class Expected:
    """What one request's calls imply: per rescheduling (cached, recompute), in order."""

    prompt: int
    reschedulings: list[tuple[int, int]] = field(default_factory=list)

    @property
    def recompute(self) -> int:
        return sum(r for _, r in self.reschedulings)

    @property
    def cached(self) -> int:
        return sum(c for c, _ in self.reschedulings)


class Driver:
    """Drives one request through a tracker step by step and writes down what its calls imply."""

    def __init__(self, tracker: RequestTracker, rid: str, prompt: int, t0: float, cached: int = 0) -> None:
        self.tracker, self.rid, self.ts = tracker, rid, t0
        self.output = 0
        self.expected = Expected(prompt)
        tracker.queued(rid, ts=t0, prompt_tokens=prompt)
        self.ts += STEP
        tracker.scheduled([rid], ts=self.ts, cached_tokens=[cached])

    def tokens(self, n: int = 1) -> None:
        for _ in range(n):
            self.ts += STEP
            self.tracker.tokens([self.rid], ts=self.ts)
            self.output += 1

    def preempt_and_reschedule(self, cached: int | None) -> None:
        self.ts += STEP
        self.tracker.preempted([self.rid], ts=self.ts)
        self.ts += STEP
        if cached is None:
            self.tracker.scheduled([self.rid], ts=self.ts)
            return
        self.tracker.scheduled([self.rid], ts=self.ts, cached_tokens=[cached])
        context = self.expected.prompt + self.output  # prompt + every token produced before P_k
        self.expected.reschedulings.append((cached, context - cached))

    def finish(self) -> None:
        self.ts += STEP
        self.tracker.finished(self.rid, ts=self.ts)


def recompute_spans(harness: Any, rid: str) -> list[ReadableSpan]:
    trace = harness.trace(rid, 0.0)
    return sorted((s for s in trace.spans if s.name == sc.SPAN_RECOMPUTE), key=lambda s: s.start_time)


def counter(harness: Any, name: str) -> int | None:
    points = harness.metrics().get(name, [])
    assert len(points) <= 1, points
    return points[0].value if points else None


def test_each_recompute_span_carries_its_rescheduling_figures(harness) -> None:
    """Preemptions before the first token, after it, twice in a row, and a recompute cut short."""
    d = Driver(harness.tracker, "r1", prompt=40, t0=100.0, cached=16)
    d.preempt_and_reschedule(cached=32)  # before the first token: the prompt only, 8 to recompute
    d.tokens(5)
    d.preempt_and_reschedule(cached=16)  # after 5 tokens: 45 - 16
    d.preempt_and_reschedule(cached=0)  # again before another token: the recompute above was cut short
    d.tokens(3)
    d.preempt_and_reschedule(cached=48)
    d.tokens(2)
    d.finish()

    spans = recompute_spans(harness, "r1")
    got = [
        (s.attributes[sc.LLM_RECOMPUTE_CACHED_TOKENS], s.attributes[sc.LLM_RECOMPUTE_TOKENS]) for s in spans
    ]
    assert got == d.expected.reschedulings
    assert got == [(32, 8), (16, 29), (0, 45), (48, 0)]  # the arithmetic, spelled out once
    root = harness.trace("r1", 0.0).root
    assert root.attributes[sc.LLM_PREEMPTIONS_RECOMPUTE_TOKENS] == d.expected.recompute
    assert root.attributes[sc.LLM_PREEMPTIONS_RECOMPUTE_CACHED_TOKENS] == d.expected.cached
    # The rescheduling's cached figure is not the prompt's cache read: that stays the first scheduling's.
    assert root.attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 16


def test_the_counters_equal_the_sums_of_the_spans(harness) -> None:
    rng = random.Random(7)
    drivers = []
    for k in range(6):
        d = Driver(harness.tracker, f"r{k}", prompt=rng.randint(1, 90), t0=10.0 * k)
        for _ in range(rng.randint(0, 4)):
            d.tokens(rng.randint(0, 6))
            d.preempt_and_reschedule(cached=rng.randint(0, d.expected.prompt + d.output))
        d.tokens(1)
        d.finish()
        drivers.append(d)

    span_tokens = span_cached = 0
    for d in drivers:
        for s in recompute_spans(harness, d.rid):
            span_tokens += s.attributes[sc.LLM_RECOMPUTE_TOKENS]
            span_cached += s.attributes[sc.LLM_RECOMPUTE_CACHED_TOKENS]
    assert span_tokens == sum(d.expected.recompute for d in drivers)
    assert span_cached == sum(d.expected.cached for d in drivers)
    assert counter(harness, sc.METRIC_RECOMPUTE_TOKENS) == span_tokens
    assert counter(harness, sc.METRIC_RECOMPUTE_CACHED_TOKENS) == span_cached
    assert counter(harness, sc.METRIC_PREEMPTIONS) == sum(len(d.expected.reschedulings) for d in drivers)


def test_without_the_figures_nothing_is_made_up(harness) -> None:
    d = Driver(harness.tracker, "plain", prompt=12, t0=1.0)
    d.tokens(2)
    d.preempt_and_reschedule(cached=None)
    d.tokens(1)
    d.finish()
    (span,) = recompute_spans(harness, "plain")
    assert sc.LLM_RECOMPUTE_TOKENS not in span.attributes
    assert sc.LLM_RECOMPUTE_CACHED_TOKENS not in span.attributes
    root = harness.trace("plain", 0.0).root
    assert sc.LLM_PREEMPTIONS_RECOMPUTE_TOKENS not in root.attributes
    metrics = harness.metrics()
    assert sc.METRIC_RECOMPUTE_TOKENS not in metrics
    assert sc.METRIC_RECOMPUTE_CACHED_TOKENS not in metrics


def test_an_unknown_prompt_length_leaves_the_cached_figure_alone(harness) -> None:
    t = harness.tracker
    t.queued("r", ts=1.0)  # no prompt_tokens: the context to recompute is unknown
    t.scheduled(["r"], ts=1.1)
    t.tokens(["r"], ts=1.2)
    t.preempted(["r"], ts=1.3)
    t.scheduled(["r"], ts=1.4, cached_tokens=[5])
    t.tokens(["r"], ts=1.5)
    t.finished("r", ts=1.6)
    (span,) = recompute_spans(harness, "r")
    assert dict(span.attributes) == {sc.LLM_RECOMPUTE_CACHED_TOKENS: 5}
    root = harness.trace("r", 0.0).root
    assert root.attributes[sc.LLM_PREEMPTIONS_RECOMPUTE_CACHED_TOKENS] == 5
    assert sc.LLM_PREEMPTIONS_RECOMPUTE_TOKENS not in root.attributes
    assert counter(harness, sc.METRIC_RECOMPUTE_CACHED_TOKENS) == 5
    assert sc.METRIC_RECOMPUTE_TOKENS not in harness.metrics()


def test_more_cached_than_the_context_is_an_anomaly(harness) -> None:
    d = Driver(harness.tracker, "odd", prompt=10, t0=1.0)
    d.tokens(2)
    d.ts += STEP
    harness.tracker.preempted(["odd"], ts=d.ts)
    harness.tracker.scheduled(["odd"], ts=d.ts + STEP, cached_tokens=[13])  # the context is 12 tokens
    d.ts += 2 * STEP
    d.tokens(1)
    d.finish()
    (span,) = recompute_spans(harness, "odd")
    assert span.attributes[sc.LLM_RECOMPUTE_TOKENS] == 0
    assert span.attributes[sc.LLM_RECOMPUTE_CACHED_TOKENS] == 13
    assert harness.tracker.anomaly_counts == {an.CACHED_OVER_CONTEXT: 1}


def test_bad_cached_tokens_at_a_rescheduling_raise(harness) -> None:
    t = harness.tracker
    t.queued("r", ts=1.0, prompt_tokens=4)
    t.scheduled(["r"], ts=1.1)
    t.tokens(["r"], ts=1.2)
    t.preempted(["r"], ts=1.3)
    with pytest.raises(ValueError, match="cached_tokens must be >= 0"):
        t.scheduled(["r"], ts=1.4, cached_tokens=[-1])
    with pytest.raises(TypeError, match="cached_tokens must be an int"):
        t.scheduled(["r"], ts=1.4, cached_tokens=[2.5])
    with pytest.raises(ValueError, match="cached_tokens has 2 entries for 1 request ids"):
        t.scheduled(["r"], ts=1.4, cached_tokens=[1, 2])
    assert "r" in t and t.anomaly_counts == {}  # nothing was recorded by the refused calls
    t.scheduled(["r"], ts=1.4, cached_tokens=[3])
    t.tokens(["r"], ts=1.5)
    t.finished("r", ts=1.6)
    (span,) = recompute_spans(harness, "r")
    assert span.attributes[sc.LLM_RECOMPUTE_TOKENS] == 4 + 1 - 3


def test_a_rescheduling_listed_twice_counts_once(harness) -> None:
    d = Driver(harness.tracker, "twice", prompt=20, t0=1.0)
    d.tokens(1)
    d.ts += STEP
    harness.tracker.preempted(["twice"], ts=d.ts)
    harness.tracker.scheduled(["twice", "twice"], ts=d.ts + STEP, cached_tokens=[4, 9])
    d.ts += 2 * STEP
    d.tokens(1)
    d.finish()
    (span,) = recompute_spans(harness, "twice")
    assert (span.attributes[sc.LLM_RECOMPUTE_CACHED_TOKENS], span.attributes[sc.LLM_RECOMPUTE_TOKENS]) == (
        4,
        21 - 4,
    )
    assert harness.tracker.anomaly_counts == {an.SCHEDULED_WHILE_RUNNING: 1}


def test_past_the_span_cap_the_request_sums_every_preemption(harness) -> None:
    d = Driver(harness.tracker, "thrash", prompt=30, t0=1.0)
    for k in range(MAX_PREEMPTION_SPANS + 5):
        d.tokens(1)
        d.preempt_and_reschedule(cached=k % 17)
    d.tokens(1)
    d.finish()
    spans = recompute_spans(harness, "thrash")
    assert len(spans) == MAX_PREEMPTION_SPANS
    assert [s.attributes[sc.LLM_RECOMPUTE_TOKENS] for s in spans] == [
        r for _, r in d.expected.reschedulings[:MAX_PREEMPTION_SPANS]
    ]
    root = harness.trace("thrash", 0.0).root
    assert root.attributes[sc.LLM_PREEMPTIONS_RECOMPUTE_TOKENS] == d.expected.recompute
    assert root.attributes[sc.LLM_PREEMPTIONS_RECOMPUTE_CACHED_TOKENS] == d.expected.cached
    assert counter(harness, sc.METRIC_RECOMPUTE_TOKENS) == d.expected.recompute


class StartWatcher(SpanProcessor):
    """A processor with an on_start of its own: its provider gets spans through tracer.start_span()."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass


def test_both_span_paths_carry_the_same_figures() -> None:
    got = {}
    for watched in (False, True):
        exporter = InMemorySpanExporter()
        tp = TracerProvider()
        if watched:
            tp.add_span_processor(StartWatcher())
        tp.add_span_processor(SimpleSpanProcessor(exporter))
        tracker = RequestTracker(tracer_provider=tp, tail_sampling=False)
        d = Driver(tracker, "r", prompt=25, t0=1.0)
        d.tokens(3)
        d.preempt_and_reschedule(cached=8)
        d.preempt_and_reschedule(cached=24)
        d.tokens(1)
        d.finish()
        got[watched] = sorted(
            (s.name, s.start_time, dict(s.attributes))
            for s in exporter.get_finished_spans()
            if s.name in (sc.SPAN_RECOMPUTE, sc.SPAN_REQUEST)
        )
        tp.shutdown()
    recomputes = [a for name, _, a in got[False] if name == sc.SPAN_RECOMPUTE]
    assert [a[sc.LLM_RECOMPUTE_TOKENS] for a in recomputes] == [28 - 8, 28 - 24]
    assert [(n, a) for n, _, a in got[False]] == [(n, a) for n, _, a in got[True]]


def test_prompt_tokens_by_source_from_engine_state(harness) -> None:
    t = harness.tracker
    reports = [(40, 16, 0), (0, 0, 0), (7, 0, 120), (3, 5, 0)]
    t.engine_state(running=1)  # no prompt figures: the counter does not exist yet
    assert sc.METRIC_PROMPT_TOKENS not in harness.metrics()
    for computed, cached, transferred in reports:
        t.engine_state(
            prompt_tokens_computed=computed,
            prompt_tokens_cached=cached,
            prompt_tokens_transferred=transferred,
        )
    by_source = {
        p.attributes[sc.LLM_PROMPT_TOKENS_SOURCE]: p.value for p in harness.metrics()[sc.METRIC_PROMPT_TOKENS]
    }
    assert by_source == {
        sc.PROMPT_SOURCE_COMPUTED: sum(r[0] for r in reports),
        sc.PROMPT_SOURCE_PREFIX_CACHE: sum(r[1] for r in reports),
        sc.PROMPT_SOURCE_KV_TRANSFER: sum(r[2] for r in reports),
    }


def test_one_source_reported_exports_all_three(harness) -> None:
    harness.tracker.engine_state(prompt_tokens_computed=9)
    by_source = {
        p.attributes[sc.LLM_PROMPT_TOKENS_SOURCE]: p.value for p in harness.metrics()[sc.METRIC_PROMPT_TOKENS]
    }
    assert by_source == {
        sc.PROMPT_SOURCE_COMPUTED: 9,
        sc.PROMPT_SOURCE_PREFIX_CACHE: 0,
        sc.PROMPT_SOURCE_KV_TRANSFER: 0,
    }


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"prompt_tokens_computed": -1}, ValueError),
        ({"prompt_tokens_cached": 1.5}, TypeError),
        ({"prompt_tokens_transferred": True}, TypeError),
    ],
)
def test_bad_prompt_token_figures_raise_and_store_nothing(
    harness, kwargs: dict[str, Any], error: type
) -> None:
    with pytest.raises(error, match=next(iter(kwargs))):
        harness.tracker.engine_state(**{"prompt_tokens_computed": 5, **kwargs})
    assert sc.METRIC_PROMPT_TOKENS not in harness.metrics()
