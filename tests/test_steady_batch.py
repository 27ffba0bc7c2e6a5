"""tokens() with the same batch as the previous step moves one shared step instead of every request.

What each request produced is written down here from the calls made (every occurrence of a request id
in a tokens() call is one tokens event at that call's timestamp), not taken from the tracker; the
tracker's spans and histograms must agree, whether the batch stays the same for many steps, changes,
is the engine's one list changed in place, or comes back after a request left it between steps.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_llm import semconv as sc

# Every test here in both export modes: the engine's process, and the export process beside it.
pytestmark = pytest.mark.both_modes

T0 = 7000.0
IDS = [f"r{i}" for i in range(6)]


class Oracle:
    """Tokens events per request, as the engine reported them."""

    def __init__(self) -> None:
        self.events: dict[str, list[float]] = {rid: [] for rid in IDS}

    def step(self, ids: list[str], ts: float) -> None:
        for rid in ids:
            self.events[rid].append(ts)

    def itl(self) -> list[float]:
        return [b - a for ev in self.events.values() for a, b in itertools.pairwise(ev)]

    def tpot(self) -> list[float]:
        return [(ev[-1] - ev[0]) / (len(ev) - 1) for ev in self.events.values() if len(ev) > 1]


def histogram(harness, name):
    points = harness.metrics().get(name, [])
    return (points[0].count, points[0].sum) if points else (0, 0.0)


def check(harness, oracle: Oracle) -> None:
    roots = {r.attributes[sc.LLM_REQUEST_ID]: r for r in harness.roots()}
    assert sorted(roots) == IDS
    for rid, ev in oracle.events.items():
        attrs = roots[rid].attributes
        assert attrs.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS, 0) == len(ev), rid
        if ev:
            assert attrs[sc.LLM_LATENCY_DECODE] == pytest.approx(ev[-1] - ev[0]), rid
    itl, tpot = oracle.itl(), oracle.tpot()
    count, total = histogram(harness, sc.METRIC_ITL)
    assert (count, total) == (len(itl), pytest.approx(sum(itl)))
    count, total = histogram(harness, sc.METRIC_TPOT)
    assert (count, total) == (len(tpot), pytest.approx(sum(tpot)))


# "bounce": preempted and scheduled again before the next step, so the batch list is the same.
ACTIONS = ["same", "same", "same", "same", "join", "finish", "preempt", "bounce", "skip", "twice"]


PLANS = st.lists(
    st.tuples(st.sampled_from(ACTIONS), st.integers(0, 5), st.sampled_from([0.0, 0.001, 0.01, 0.3])),
    max_size=70,
)


@pytest.mark.in_process_only("250 examples; the export process runs its own below")
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=PLANS, reuse=st.booleans())
def test_steady_and_changing_batches_count_every_tokens_event(make_harness, plan, reuse):
    run_plan(make_harness(max_age_s=1e9), plan, reuse)


@settings(max_examples=20, deadline=None)
@given(plan=PLANS, reuse=st.booleans())
def test_steady_and_changing_batches_count_every_tokens_event_through_the_export_process(plan, reuse):
    """The same counts with the export process between the tracker and the checks (fewer examples: each
    starts one)."""
    from export_harness import ExportHarness

    h = ExportHarness(max_age_s=1e9)
    try:
        run_plan(h, plan, reuse)
    finally:
        h.close()


def run_plan(h, plan, reuse):
    """Drive ``h``'s tracker through ``plan`` and check every count against the oracle."""
    t = h.tracker
    oracle = Oracle()
    ts = T0
    for rid in IDS:
        t.queued(rid, ts=ts)
    waiting = list(IDS)  # queued or preempted, not running
    batch: list[str] = []  # the running batch, in the engine's order
    done: set[str] = set()
    for action, k, dt in plan:
        ts += dt
        step = batch
        if action == "join" and waiting:
            rid = waiting.pop(k % len(waiting))
            t.scheduled([rid], ts=ts)
            batch.append(rid)
        elif action in ("finish", "preempt") and batch:
            rid = batch.pop(k % len(batch))
            if action == "finish":
                t.finished(rid, ts=ts, reason="stop")
                done.add(rid)
            else:
                t.preempted([rid], ts=ts)
                waiting.append(rid)
        elif action == "bounce" and batch:
            rid = batch[k % len(batch)]
            t.preempted([rid], ts=ts)
            t.scheduled([rid], ts=ts)
        elif action == "skip" and batch:
            step = batch[: k % len(batch)] + batch[k % len(batch) + 1 :]  # not in this step only
        elif action == "twice" and batch:
            step = [*batch, batch[k % len(batch)]]  # listed twice: two tokens events
        ts += dt
        # With reuse, the engine hands over its one list, changed in place between steps.
        ids = step if reuse or step is not batch else list(step)
        t.tokens(ids, ts=ts)
        oracle.step(ids, ts)
    ts += 0.01
    for rid in IDS:
        if rid not in done:
            t.finished(rid, ts=ts, reason="stop")
    check(h, oracle)


def test_a_long_steady_batch(harness):
    """The common case: one batch for many steps, then one request leaves and the rest go on."""
    t = harness.tracker
    oracle = Oracle()
    for rid in IDS:
        t.queued(rid, ts=T0)
    t.scheduled(IDS, ts=T0 + 0.001)
    ts = T0 + 0.002
    for i in range(40):
        ts += 0.001 * (1 + i % 3)
        t.tokens(list(IDS), ts=ts)
        oracle.step(IDS, ts)
    t.finished("r2", ts=ts, reason="length")
    rest = [rid for rid in IDS if rid != "r2"]
    for _ in range(10):
        ts += 0.002
        t.tokens(list(rest), ts=ts)
        oracle.step(rest, ts)
    for rid in rest:
        t.finished(rid, ts=ts + 0.01, reason="stop")
    check(harness, oracle)
    assert t.anomaly_counts == {}


def test_a_finished_request_listed_again_is_unknown_and_keeps_its_count(harness):
    """An engine that lists a finished request once more: the anomaly is counted, its trace unchanged."""
    t = harness.tracker
    for rid in ("a", "b"):
        t.queued(rid, ts=T0)
    t.scheduled(["a", "b"], ts=T0)
    for i in range(1, 4):
        t.tokens(["a", "b"], ts=T0 + i)
    t.finished("a", ts=T0 + 3)
    t.tokens(["a", "b"], ts=T0 + 4)
    t.tokens(["a", "b"], ts=T0 + 5)
    t.finished("b", ts=T0 + 6)
    roots = {r.attributes[sc.LLM_REQUEST_ID]: r.attributes for r in harness.roots()}
    assert roots["a"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert roots["a"][sc.LLM_LATENCY_DECODE] == pytest.approx(2.0)
    assert roots["b"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
    assert t.anomaly_counts.get("unknown_request") == 2
