"""The stall finder's per-stall path (``stalls.find_logged``, over the batch log's gap index) against the
rule worked over each request's token times (``stalls.find``, docs/lifecycle.md "Stalls").

Engine stories with seeded randomness: requests arriving, prefilling, decoding in steps of varied length,
idle spells, preemptions, steps that leave running requests out, requests the tracker has not heard of,
and logs small enough to be trimmed many times. Every finished request's stalls are worked out both ways
from the same log, in the same state.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from otel_llm.hooks import stalls as finder
from otel_llm.hooks.batches import BatchLog
from otel_llm.hooks.tracker import Tracker

pytestmark = pytest.mark.in_process_only("the tracker's own batch log, in the engine's process")


def _both_ways(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, Any]]:
    """Make every finish work its stalls out both ways; returns where the pairs go."""
    pairs: list[tuple[Any, Any]] = []

    def stalls(self: Tracker, fin: Any, batches: BatchLog) -> Any:
        first, last = fin.timeline.first_token, fin.last_token
        if first is None or last is None:
            return (), ()
        with self._lock:
            indexed = finder.find_logged(fin, batches)
            steps, ends, partial = batches.between(first, last)
            exact = finder.find(fin, steps, ends, partial, batches.oldest_start())
        pairs.append((indexed, exact))
        return exact

    monkeypatch.setattr(Tracker, "_stalls", stalls)
    return pairs


def _story(tracker: Any, seed: int) -> None:
    """One engine's run: arrivals, prefills, decode steps of varied length, preemptions, idle spells."""
    rnd = random.Random(seed)
    if seed % 3 == 0:
        tracker._batch_log = BatchLog(size=rnd.choice([4, 16, 64]))  # trimmed again and again
    ts = 1000.0
    running: list[str] = []
    waiting: list[str] = []
    made = 0
    for _ in range(rnd.randint(50, 300)):
        for _ in range(rnd.choice([0, 0, 0, 1, 2])):
            rid = f"r{made}"
            made += 1
            tracker.queued(rid, ts=ts, prompt_tokens=8)
            waiting.append(rid)
        fresh: set[str] = set()
        if waiting and rnd.random() < 0.5:
            fresh = set(waiting[: rnd.randint(1, len(waiting))])
            waiting = [r for r in waiting if r not in fresh]
            tracker.scheduled(sorted(fresh), ts=ts)
            running += sorted(fresh)
        if running and rnd.random() < 0.05:
            victim = rnd.choice(running)
            running.remove(victim)
            tracker.preempted([victim], ts=ts)
            waiting.append(victim)
        # Now and then a step leaves running requests out, or holds a prompt the tracker never heard of.
        held = [r for r in running if rnd.random() > 0.05] if rnd.random() < 0.2 else list(running)
        scheduled = {r: (rnd.choice([8, 30, 300]) if r in fresh else 1) for r in held}
        if rnd.random() < 0.05:
            scheduled["unknown"] = 200
        if scheduled:
            tracker.batch(scheduled, ts=ts)
        ts += rnd.choice([0.005] * 20 + [0.02, 0.05, 0.2]) * rnd.uniform(0.9, 1.1)
        if held:
            tracker.tokens(held, ts=ts)
        if rnd.random() < 0.03:
            ts += 0.1  # no step for a while
        for rid in list(running):
            if rnd.random() < 0.02:
                running.remove(rid)
                tracker.finished(rid, ts=ts)
    for rid in running + waiting:
        tracker.finished(rid, ts=ts)


def test_the_index_finds_what_the_rule_over_token_times_finds(harness, monkeypatch) -> None:
    pairs = _both_ways(monkeypatch)
    for seed in range(24):
        _story(harness.tracker, seed)
        harness.tracker._batch_log = None  # the next story starts a log of its own
    indexed = [(a, b) for a, b in pairs if a is not None]
    # Most requests take the index; those a step left out take the exact path (None here).
    assert len(indexed) > len(pairs) / 2
    assert sum(len(b[1]) for _, b in indexed) > 100  # stalls enough to compare, of every kind below
    causes = {row[2] for _, b in indexed for row in b[1]}
    assert {"idle", "slow_step", "prefill", "preemption"} <= causes
    for fast, exact in indexed:
        assert fast[1] == exact[1]  # the rows, each field
        assert [(c, n) for c, n, _ in fast[0]] == [(c, n) for c, n, _ in exact[0]]
        assert [s for _, _, s in fast[0]] == pytest.approx([s for _, _, s in exact[0]], abs=1e-9)


def test_a_long_request_finds_its_stalls_past_the_exact_median(harness) -> None:
    """3,000 decode steps of 10 ms with a 60 ms step every 100th: the typical gap (estimated past 256
    gaps) is 10 ms, so the 30 slow steps after the first token are its stalls, each 60 ms, cause
    ``slow_step`` (nothing else in the step); the log indexes each step's gap once."""
    t = harness.tracker
    t.queued("long", ts=0.0)
    t.scheduled(["long"], ts=0.0)
    ts = 0.0
    for k in range(3000):
        t.batch({"long": 1}, ts=ts)
        ts += 0.060 if k % 100 == 99 else 0.010
        t.tokens(["long"], ts=ts)
    t.finished("long", ts=ts)
    log = t._batch_log
    assert len(log.gaps) == len(log.steps)
    tr = harness.trace("long", 0.0)
    from otel_llm import semconv as sc

    assert tr.root.attributes[sc.LLM_STALLS] == 30
    assert tr.root.attributes[sc.LLM_STALLED_PREFIX + "slow_step"] == pytest.approx(30 * 0.060)
    # Each event says how long the step ran against the request's typical gap (16 events: the longest).
    stalls = [e for e in tr.child(tr.root, sc.SPAN_DECODE).events if e.name == sc.EVENT_STALL]
    assert len(stalls) == 16
    for event in stalls:
        assert event.attributes[sc.LLM_STALL_CAUSE] == sc.STALL_SLOW_STEP
        assert event.attributes[sc.LLM_STALL_STEP_TIME] == pytest.approx(0.060)
        assert event.attributes[sc.LLM_STALL_TYPICAL_GAP] == pytest.approx(0.010)
