"""Engine time (docs/lifecycle.md, "Engine time"): each step's time split among its requests by the tokens
it computed for each, on ``llm.request`` and in the counter ``llm.server.engine.time``.

Each story is told with explicit timestamps, and the expected seconds are worked out here by hand from
the cost model, step by step, not read from the code under test. The reference engine's real run is
checked against its own steps in tests/engine/test_engine_cost_shares.py.
"""

from __future__ import annotations

import pytest

from otel_llm import semconv as sc

pytestmark = pytest.mark.both_modes

T0 = 5000.0
MS = 0.001


def engine_time(harness, rid):
    attributes = harness.trace(rid, T0).root.attributes
    return attributes.get(sc.LLM_ENGINE_TIME), attributes.get(sc.LLM_ENGINE_TIME_RECOMPUTE)


def counter(harness):
    """The counter's points as {(llm.engine.work, tenant or None): seconds}."""
    points = harness.metrics().get(sc.METRIC_ENGINE_TIME, [])
    return {(p.attributes[sc.LLM_ENGINE_WORK], p.attributes.get("tenant")): p.value for p in points}


def test_shares_by_tokens_through_chunks_a_preemption_and_a_step_that_left_one_out(make_harness):
    h = make_harness(env={"OTEL_LLM_ENGINE_TIME_ATTRIBUTES": "tenant"})
    t = h.tracker
    t.queued("a", ts=T0, prompt_tokens=30, attributes={"tenant": "blue"})
    t.queued("b", ts=T0, prompt_tokens=20, attributes={"tenant": "green"})
    t.scheduled(["a", "b"], ts=T0)
    # 1: 40 ms, a's whole prompt and half of b's: a 30/40, b 10/40. Only a gets a token.
    t.batch({"a": 30, "b": 10}, ts=T0)
    t.tokens(["a"], ts=T0 + 40 * MS)
    # 2: 11 ms, b's last chunk (10 tokens) and a's decode token: b 10 ms, a 1 ms. Both get a token.
    t.batch({"a": 1, "b": 10}, ts=T0 + 40 * MS)
    t.tokens(["a", "b"], ts=T0 + 51 * MS)
    # 3: b is preempted before the step; a alone, 4 ms.
    t.preempted(["b"], ts=T0 + 51 * MS)
    t.batch({"a": 1}, ts=T0 + 51 * MS)
    t.tokens(["a"], ts=T0 + 55 * MS)
    # 4: b rescheduled, recomputes 21 tokens in a step with no token (a chunk), 7 ms, which also left a
    # out (a running request the step did not hold): b has all of it, all recompute.
    t.scheduled(["b"], ts=T0 + 55 * MS)
    t.batch({"b": 21}, ts=T0 + 55 * MS)
    t.tokens([], ts=T0 + 62 * MS)
    # 5: 2 ms idle, then a step of 3 ms: b's last recompute token and a's decode: 1.5 ms each, b's is
    # recompute (its next token comes at this step's end).
    t.batch({"a": 1, "b": 1}, ts=T0 + 64 * MS)
    t.tokens(["a", "b"], ts=T0 + 67 * MS)
    # 6: speculative decoding, 6 ms: a 3 tokens, b 1: a 4.5 ms, b 1.5 ms.
    t.batch({"a": 3, "b": 1}, ts=T0 + 67 * MS)
    t.tokens(["a", "b"], ts=T0 + 73 * MS, counts=[3, 1])
    t.finished("a", ts=T0 + 73 * MS)
    t.finished("b", ts=T0 + 73 * MS)

    a = 30 + 1 + 4 + 1.5 + 4.5
    b = 10 + 10 + 7 + 1.5 + 1.5
    b_recompute = 7 + 1.5
    got_a, got_a_recompute = engine_time(h, "a")
    got_b, got_b_recompute = engine_time(h, "b")
    assert got_a == pytest.approx(a * MS) and got_a_recompute == 0.0
    assert got_b == pytest.approx(b * MS) and got_b_recompute == pytest.approx(b_recompute * MS)
    busy = 40 + 11 + 4 + 7 + 3 + 6  # every step's time; the 2 ms between steps 4 and 5 is idle
    assert got_a + got_b == pytest.approx(busy * MS)
    assert counter(h) == pytest.approx(
        {
            ("compute", "blue"): a * MS,
            ("compute", "green"): (b - b_recompute) * MS,
            ("recompute", "green"): b_recompute * MS,
        }
    )


def test_a_step_scheduled_before_the_last_one_ended_counts_its_overlap_once(harness):
    t = harness.tracker
    t.queued("a", ts=T0, prompt_tokens=4)
    t.queued("b", ts=T0, prompt_tokens=4)
    t.scheduled(["a", "b"], ts=T0)
    t.batch({"a": 4, "b": 4}, ts=T0)
    t.tokens(["a", "b"], ts=T0 + 10 * MS)
    # The next step was scheduled at 6 ms, while the first ran until 10 ms, and is reported as its
    # outputs arrive (as vLLM's frontend does): 5 ms of its own, not 9.
    t.batch({"a": 1, "b": 1}, ts=T0 + 6 * MS)
    t.tokens(["a", "b"], ts=T0 + 15 * MS)
    t.finished("a", ts=T0 + 15 * MS)
    t.finished("b", ts=T0 + 15 * MS)
    for rid in ("a", "b"):
        assert engine_time(harness, rid) == pytest.approx((7.5 * MS, 0.0))


def test_a_step_that_ran_over_a_preemption_is_the_evicted_requests_too(harness):
    """An engine that schedules the next step while one runs (SGLang's overlap scheduler) may evict a
    request while a step that holds it is still running, and report that step (``batch()``, with its
    launch time) when its result comes, after the eviction: the step computed for it all the same."""
    t = harness.tracker
    t.queued("a", ts=T0, prompt_tokens=4)
    t.queued("b", ts=T0, prompt_tokens=4)
    t.scheduled(["a", "b"], ts=T0)
    t.batch({"a": 4, "b": 4}, ts=T0)  # 4 ms: 2 each
    t.tokens(["a", "b"], ts=T0 + 4 * MS)
    t.preempted(["b"], ts=T0 + 6 * MS)  # while the step launched at 4 ms runs
    t.batch({"a": 1, "b": 1}, ts=T0 + 4 * MS)  # 6 ms: 3 each, though b was evicted while it ran
    t.tokens(["a"], ts=T0 + 10 * MS)
    t.scheduled(["b"], ts=T0 + 10 * MS)
    t.batch({"a": 1, "b": 5}, ts=T0 + 10 * MS)  # 6 ms: a 1, b 5 of recompute
    t.tokens(["a", "b"], ts=T0 + 16 * MS)
    t.finished("a", ts=T0 + 16 * MS)
    t.finished("b", ts=T0 + 16 * MS)
    assert engine_time(harness, "a") == pytest.approx((6 * MS, 0.0))
    assert engine_time(harness, "b") == pytest.approx((10 * MS, 5 * MS))


def test_a_request_never_scheduled_cost_nothing_and_no_batch_means_no_figure(make_harness):
    h = make_harness()
    t = h.tracker
    t.queued("a", ts=T0, prompt_tokens=4)
    t.queued("waits", ts=T0, prompt_tokens=4)
    t.scheduled(["a"], ts=T0)
    t.batch({"a": 4}, ts=T0)
    t.tokens(["a"], ts=T0 + 3 * MS)
    t.finished("a", ts=T0 + 3 * MS)
    t.finished("waits", reason="abort", ts=T0 + 4 * MS)
    assert engine_time(h, "a") == pytest.approx((3 * MS, 0.0))
    assert engine_time(h, "waits") == (0.0, 0.0)

    plain = make_harness()  # an engine that never calls batch(): nothing is known, not zero
    plain.tracker.queued("c", ts=T0, prompt_tokens=4)
    plain.tracker.scheduled(["c"], ts=T0)
    plain.tracker.tokens(["c"], ts=T0 + 3 * MS)
    plain.tracker.finished("c", ts=T0 + 3 * MS)
    assert engine_time(plain, "c") == (None, None)
    assert sc.METRIC_ENGINE_TIME not in plain.metrics()
