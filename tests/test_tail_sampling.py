"""Tail sampling at finished(): each rule keeps what it says and nothing else is kept; metrics count every
request whatever the decision; exemplars point only at kept traces; decisions are counted by reason.

Requests are driven with explicit monotonic timestamps, so the same script run with and without sampling
produces identical metric values. tests/engine/test_engine_state.py runs the reference engine into real
preemptions with tail sampling on.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from otel_llm import semconv as sc
from otel_llm.emit.sampling import (
    ENV_E2E_S,
    ENV_RATIO,
    ENV_TAIL_SAMPLING,
    ENV_TTFT_S,
    TailSampling,
)

# Every test here in both export modes: the engine's process, and the export process beside it.
pytestmark = pytest.mark.both_modes

NONE_KEPT = TailSampling(ratio=0.0)
SAMPLED_PARENT = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
UNSAMPLED_PARENT = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}


def plain(tracker: Any, rid: str, t0: float, ttft: float = 0.02, tokens: int = 4, **queued: Any) -> float:
    """queued at t0, scheduled 10 ms later, first token at t0 + ttft, one token per 10 ms, then stop."""
    tracker.queued(rid, ts=t0, prompt_tokens=8, **queued)
    tracker.scheduled([rid], ts=t0 + 0.01)
    ts = t0 + ttft
    for _ in range(tokens):
        tracker.tokens([rid], ts=ts)
        ts += 0.01
    tracker.finished(rid, ts=ts)
    return ts


def kept_ids(h: Any) -> set[str]:
    return {s.attributes[sc.LLM_REQUEST_ID] for s in h.roots()}


def decisions(h: Any) -> dict[tuple[str, str], int]:
    points = h.metrics().get(sc.METRIC_SAMPLING_DECISIONS, [])
    return {
        (p.attributes[sc.LLM_SAMPLING_DECISION], p.attributes[sc.LLM_SAMPLING_REASON]): p.value
        for p in points
    }


def test_each_rule_keeps_what_it_says_and_the_rest_is_dropped(make_harness) -> None:
    h = make_harness(tail_sampling=TailSampling(ratio=0.0, ttft_s=0.5, e2e_s=2.0))
    t = h.tracker
    plain(t, "fast", 10.0)
    plain(t, "slow-ttft", 20.0, ttft=0.6)
    plain(t, "ttft-at-threshold", 30.0, ttft=0.5)  # not above the threshold: dropped
    plain(t, "slow-e2e", 40.0, tokens=200)  # 0.01 + 200 * 0.01 s > 2 s
    plain(t, "sampled-parent", 50.0, carrier=SAMPLED_PARENT)
    plain(t, "unsampled-parent", 60.0, carrier=UNSAMPLED_PARENT)
    t.queued("error", ts=70.0)
    t.scheduled(["error"], ts=70.01)
    t.finished("error", reason="error", ts=70.02, error=RuntimeError("boom"))
    t.queued("preempted", ts=80.0)
    t.scheduled(["preempted"], ts=80.01)
    t.tokens(["preempted"], ts=80.02)
    t.preempted(["preempted"], ts=80.03)
    t.scheduled(["preempted"], ts=80.04)
    t.tokens(["preempted"], ts=80.05)
    t.finished("preempted", ts=80.06)
    t.queued("abort", ts=90.0)
    t.finished("abort", reason="abort", ts=90.01)  # a client abort is not a failure

    assert kept_ids(h) == {"slow-ttft", "slow-e2e", "sampled-parent", "error", "preempted"}
    assert decisions(h) == {
        ("keep", "slow_ttft"): 1,
        ("keep", "slow_e2e"): 1,
        ("keep", "parent_sampled"): 1,
        ("keep", "error"): 1,
        ("keep", "preempted"): 1,
        ("drop", "ratio"): 4,
    }
    # A dropped request's spans were never built: nothing of its trace exists, not even a child span.
    kept_traces = {s.context.trace_id for s in h.roots()}
    assert {s.context.trace_id for s in h.finished_spans()} == kept_traces


def test_evicted_requests_are_kept(make_harness) -> None:
    h = make_harness(tail_sampling=NONE_KEPT, max_in_flight=1)
    h.tracker.queued("old", ts=1.0)
    h.tracker.queued("new", ts=2.0)  # over max_in_flight: "old" is closed as evicted
    h.tracker.finished("new", ts=2.5)
    plain(h.tracker, "done", 3.0)
    assert kept_ids(h) == {"old"}
    assert decisions(h) == {("keep", "error"): 1, ("drop", "ratio"): 2}


def test_ratio_keeps_the_traces_whose_id_falls_below_it(make_harness) -> None:
    h = make_harness(tail_sampling=TailSampling(ratio=0.5))
    expected = set()
    for i in range(64):
        rid = f"r{i}"
        h.tracker.queued(rid, ts=float(i))
        trace_id = int(h.tracker.traceparent(rid).split("-")[1], 16)
        if trace_id & (2**64 - 1) < 2**63:
            expected.add(rid)
        h.tracker.scheduled([rid], ts=i + 0.01)
        h.tracker.tokens([rid], ts=i + 0.02)
        h.tracker.finished(rid, ts=i + 0.03)
    assert kept_ids(h) == expected
    assert 0 < len(expected) < 64  # 64 random ids: both outcomes occur (chance of failing: 2 ** -63)


def test_ratio_one_and_sampling_off_keep_everything(make_harness) -> None:
    for setting in (TailSampling(ratio=1.0), False):
        h = make_harness(tail_sampling=setting)
        for i in range(5):
            plain(h.tracker, f"r{i}", float(i))
        assert len(h.roots()) == 5
        assert (sc.METRIC_SAMPLING_DECISIONS in h.metrics()) is (setting is not False)


@pytest.mark.in_process_only("a provider of the test's own, with its own sampler")
def test_head_sampler_still_applies_to_kept_traces(make_harness) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    h = make_harness(tail_sampling=NONE_KEPT)
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(h.span_exporter))
    from otel_llm import RequestTracker

    tracker = RequestTracker(
        tracer_provider=provider, meter_provider=h.meter_provider, tail_sampling=NONE_KEPT
    )
    tracker.queued("e", ts=1.0)
    tracker.finished("e", reason="error", ts=2.0)  # tail sampling keeps it, the head sampler does not
    assert h.finished_spans() == []


def script(tracker: Any) -> None:
    """A mix of kept and dropped requests, all at explicit timestamps."""
    for i in range(12):
        plain(tracker, f"p{i}", 100.0 + i, ttft=0.02 + 0.1 * i, tokens=3 + i)
    tracker.queued("e", ts=200.0)
    tracker.finished("e", reason="error", ts=200.5)
    tracker.queued("x", ts=300.0)
    tracker.scheduled(["x"], ts=300.01)
    tracker.tokens(["x"], ts=300.02)
    tracker.preempted(["x"], ts=300.03)
    tracker.scheduled(["x"], ts=300.1)
    tracker.tokens(["x"], ts=300.2)
    tracker.finished("x", ts=300.3)


def snapshot(h: Any) -> dict[str, list[tuple]]:
    """Every otel_llm metric point, exemplars left out (the one thing sampling may change)."""
    out: dict[str, list[tuple]] = {}
    for name, points in h.metrics().items():
        if name == sc.METRIC_SAMPLING_DECISIONS:
            continue
        rows = []
        for p in points:
            attrs = tuple(sorted(p.attributes.items()))
            if hasattr(p, "bucket_counts"):
                rows.append((attrs, p.count, round(p.sum, 9), tuple(p.bucket_counts)))
            else:
                rows.append((attrs, p.value))
        out[name] = sorted(rows)
    return out


def test_metrics_count_identically_with_and_without_sampling(make_harness) -> None:
    everything = make_harness(tail_sampling=False)
    sampled = make_harness(tail_sampling=TailSampling(ratio=0.0, ttft_s=0.5))
    script(everything.tracker)
    script(sampled.tracker)

    assert len(everything.roots()) == 14
    assert 0 < len(sampled.roots()) < 14
    assert snapshot(sampled) == snapshot(everything)


def test_exemplars_point_only_at_kept_traces(make_harness) -> None:
    h = make_harness(tail_sampling=TailSampling(ratio=0.0, ttft_s=0.5))
    script(h.tracker)
    kept = {(s.context.trace_id, s.context.span_id) for s in h.roots()}
    exemplars = [
        (e.trace_id, e.span_id)
        for name in (sc.METRIC_REQUEST_DURATION, sc.METRIC_QUEUE)
        for p in h.metrics()[name]
        for e in p.exemplars
    ]
    assert exemplars, "expected exemplars of the kept requests"
    assert set(exemplars) <= kept


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, make_harness) -> None:
    for name in (ENV_TAIL_SAMPLING, ENV_RATIO, ENV_TTFT_S, ENV_E2E_S):
        monkeypatch.delenv(name, raising=False)
    assert TailSampling.from_env() is None  # off by default
    monkeypatch.setenv(ENV_TAIL_SAMPLING, "on")
    assert TailSampling.from_env() == TailSampling(ratio=0.05)
    monkeypatch.setenv(ENV_RATIO, "0")
    monkeypatch.setenv(ENV_TTFT_S, "0.5")
    monkeypatch.setenv(ENV_E2E_S, "30")
    assert TailSampling.from_env() == TailSampling(ratio=0.0, ttft_s=0.5, e2e_s=30.0)

    h = make_harness()  # the tracker reads the variables
    plain(h.tracker, "fast", 1.0)
    plain(h.tracker, "slow", 2.0, ttft=0.7)
    assert kept_ids(h) == {"slow"}


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (ENV_TAIL_SAMPLING, "sometimes", "'on' or 'off'"),
        (ENV_RATIO, "1.5", "between 0 and 1"),
        (ENV_RATIO, "five percent", "must be a number"),
        (ENV_TTFT_S, "-1", ">= 0"),
        (ENV_E2E_S, "nan", "finite"),
    ],
)
def test_bad_settings_fail_early(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    from otel_llm import RequestTracker

    monkeypatch.setenv(ENV_TAIL_SAMPLING, "on")
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message) as caught:
        RequestTracker()
    # The message starts with the one variable to fix (not a pattern of several).
    assert re.match(rf"{name}\b", str(caught.value)), str(caught.value)


def test_bad_constructor_settings_fail_early() -> None:
    from otel_llm import RequestTracker

    with pytest.raises(ValueError, match="between 0 and 1"):
        TailSampling(ratio=-0.1)
    with pytest.raises(TypeError, match="seconds"):
        TailSampling(ttft_s="1s")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="TailSampling"):
        RequestTracker(tail_sampling=0.05)  # type: ignore[arg-type]
