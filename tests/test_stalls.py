"""Stalls (docs/lifecycle.md, "Stalls"): the ``batch()`` hook's steps, the gaps that stand out and their
causes, as the trace and the metrics carry them.

Each scenario is an engine story told with explicit timestamps; the expected stalls are worked out here
from the rule in docs/lifecycle.md (a gap of at least 3 typical gaps and at least 2 ms; the cause from
the steps that ended inside it), not read from the code under test.
"""

from __future__ import annotations

import pytest

from otel_llm import semconv as sc
from otel_llm.kit.waterfall import from_readable_spans, group_requests
from otel_llm.kit.waterfall_render import STALL, render_lines

pytestmark = pytest.mark.both_modes

T0 = 7000.0
STEP = 0.005  # a plain decode step


def decode_steps(t, ids, start, n, step=STEP, extra=None):
    """``n`` decode steps of ``ids`` from ``start``: batch() at each step's start, tokens() at its end.
    ``extra``: request id -> tokens of other work in every one of these steps (prefill chunks)."""
    ts = start
    for _ in range(n):
        scheduled = dict.fromkeys(ids, 1)
        scheduled.update(extra or {})
        t.batch(scheduled, ts=ts)
        ts += step
        t.tokens(ids, ts=ts)
    return ts


def stall_events(tr):
    decode = tr.child(tr.root, sc.SPAN_DECODE)
    return [e for e in decode.events if e.name == sc.EVENT_STALL]


def prefill_story(t):
    """r1 decodes in 5 ms steps; one step also runs r2's 2,048-token prompt and takes 120 ms. Returns
    (when r2 arrived, when that step ended)."""
    t.queued("r1", ts=T0, prompt_tokens=4)
    t.scheduled(["r1"], ts=T0)
    t.batch({"r1": 4}, ts=T0)
    first = T0 + 0.004
    t.tokens(["r1"], ts=first)
    ts = decode_steps(t, ["r1"], first, 10)
    t.queued("r2", ts=ts, prompt_tokens=2048)
    t.scheduled(["r2"], ts=ts)
    t.batch({"r1": 1, "r2": 2048}, ts=ts)
    stalled_at = ts + 0.120
    t.tokens(["r1", "r2"], ts=stalled_at)
    end = decode_steps(t, ["r1", "r2"], stalled_at, 10)
    t.finished("r1", ts=end)
    t.finished("r2", ts=end)
    return ts, stalled_at


def test_a_long_prefill_in_the_batch_is_named(harness):
    ts, stalled_at = prefill_story(harness.tracker)
    tr = harness.trace("r1", T0)
    (event,) = stall_events(tr)
    a = event.attributes
    assert a[sc.LLM_STALL_CAUSE] == "prefill"
    assert a[sc.LLM_STALL_DURATION] == pytest.approx(0.120)
    assert a[sc.LLM_STALL_TOKEN] == 12  # the first token, 10 decode tokens, then this one
    assert a[sc.LLM_STALL_PREFILL_TOKENS] == 2048 and a[sc.LLM_STALL_RECOMPUTE_TOKENS] == 0
    assert a[sc.LLM_STALL_DECODE_TOKENS] == 1 and a[sc.LLM_STALL_STEPS] == 1
    assert tuple(a[sc.LLM_STALL_REQUESTS]) == ("r2",) and tuple(a[sc.LLM_STALL_REQUEST_TOKENS]) == (2048,)
    assert abs(event.timestamp - tr.at(stalled_at)) <= 1000
    root = tr.root.attributes
    assert root[sc.LLM_STALLS] == 1
    assert root[sc.LLM_STALLED_PREFIX + "prefill"] == pytest.approx(0.120)
    # r2's own gaps are all 5 ms after its first token: no stall, but the figures are there (0).
    r2 = harness.trace("r2", ts)
    assert r2.root.attributes[sc.LLM_STALLS] == 0 and not stall_events(r2)

    m = harness.metrics()
    (p,) = [p for p in m[sc.METRIC_STALLED] if p.attributes.get(sc.LLM_STALL_CAUSE) == "prefill"]
    assert p.count == 1 and p.sum == pytest.approx(0.120)
    # Its exemplar points at the stalled request's span.
    assert {e.trace_id for e in p.exemplars} == {tr.root.context.trace_id}


@pytest.mark.parametrize("detail", ["request", "steps"])
def test_every_detail_level_carries_the_stall(export_mode, detail):
    """At detail ``request`` (no llm.decode) the events go on llm.request; at ``steps`` on llm.decode."""
    from export_harness import ExportHarness
    from harness import Harness

    harness = (ExportHarness if export_mode == "process" else Harness)(trace_detail=detail)
    try:
        prefill_story(harness.tracker)
        tr = harness.trace("r1", T0)
        carrier = tr.root if detail == "request" else tr.child(tr.root, sc.SPAN_DECODE)
        (event,) = [e for e in carrier.events if e.name == sc.EVENT_STALL]
        assert event.attributes[sc.LLM_STALL_CAUSE] == "prefill"
        assert tr.root.attributes[sc.LLM_STALLS] == 1
        others = [e for s in tr.spans if s is not carrier for e in s.events if e.name == sc.EVENT_STALL]
        assert others == []
    finally:
        harness.close()


def test_the_viewer_marks_and_tells_the_stall(harness):
    """The waterfall of r1: its decode row marked where it stalled, the stall in its summary in words,
    and the glyph in the legend."""
    prefill_story(harness.tracker)
    (trace,) = [
        t for t in group_requests(from_readable_spans(harness.finished_spans())) if t.request_id == "r1"
    ]
    lines = ["".join(text for text, _ in line) for line in render_lines(trace, width=120)]
    text = "\n".join(lines)
    (decode_row,) = [line for line in lines if line.lstrip().startswith(sc.SPAN_DECODE)]
    assert STALL[0] in decode_row
    assert "stalls: 1 (prefill 120 ms)" in text
    assert (
        "longest stall: token 12 waited 120 ms: 1 other request prefilled 2,048 tokens in the same " in text
    )
    assert "step (r2 2,048)" in text.replace("\n", " ")
    assert f"{STALL[0]} stalled" in text
    # r2 never stalled: its summary says 0 and nothing is drawn.
    (other,) = [
        t for t in group_requests(from_readable_spans(harness.finished_spans())) if t.request_id == "r2"
    ]
    other_text = "\n".join("".join(t for t, _ in line) for line in render_lines(other, width=120))
    assert "stalls: 0" in other_text and STALL[0] not in other_text


def test_a_preemption_a_recompute_and_an_idle_engine(harness):
    """r1 is preempted (its gap is its own preemption's), r3's recompute fills a slow step, and the
    engine runs no step for 50 ms."""
    t = harness.tracker
    t.queued("r1", ts=T0, prompt_tokens=8)
    t.queued("r3", ts=T0, prompt_tokens=8)
    t.scheduled(["r1", "r3"], ts=T0)
    t.batch({"r1": 8, "r3": 8}, ts=T0)
    first = T0 + 0.005
    t.tokens(["r1", "r3"], ts=first)
    ts = decode_steps(t, ["r1", "r3"], first, 8)
    # r3 is preempted and rescheduled at once: 8 + 9 tokens recomputed in a 90 ms step beside r1.
    t.preempted(["r3"], ts=ts)
    t.scheduled(["r3"], ts=ts)
    t.batch({"r1": 1, "r3": 17}, ts=ts)
    recomputed = ts + 0.090
    t.tokens(["r1", "r3"], ts=recomputed)
    ts = decode_steps(t, ["r1", "r3"], recomputed, 8)
    idle_from = ts
    ts = decode_steps(t, ["r1", "r3"], ts + 0.050, 1)  # 50 ms with no step, then a 5 ms one
    idle_to = ts
    # r1 is preempted for 200 ms.
    t.preempted(["r1"], ts=ts)
    ts = decode_steps(t, ["r3"], ts, 2)
    back = ts + 0.200
    t.scheduled(["r1"], ts=back)
    t.batch({"r1": 30, "r3": 1}, ts=back)
    t.tokens(["r1", "r3"], ts=back + 0.010)
    end = decode_steps(t, ["r1", "r3"], back + 0.010, 8)
    t.finished("r1", ts=end)
    t.finished("r3", ts=end)

    r1 = harness.trace("r1", T0)
    causes = [
        (e.attributes[sc.LLM_STALL_CAUSE], e.attributes[sc.LLM_STALL_DURATION]) for e in stall_events(r1)
    ]
    assert [c for c, _ in causes] == ["recompute", "idle", "preemption"]
    assert causes[0][1] == pytest.approx(0.090)
    assert causes[1][1] == pytest.approx(idle_to - idle_from)
    assert causes[2][1] == pytest.approx(back + 0.010 - idle_to)
    recompute = stall_events(r1)[0].attributes
    assert recompute[sc.LLM_STALL_RECOMPUTE_TOKENS] == 17
    assert tuple(recompute[sc.LLM_STALL_REQUESTS]) == ("r3",)
    a = r1.root.attributes
    assert a[sc.LLM_STALLS] == 3
    assert a[sc.LLM_STALLED_PREFIX + "preemption"] == pytest.approx(back + 0.010 - idle_to)
    # r3: its own recompute's 90 ms are its preemption's gap, then the same 55 ms without a step as r1,
    # and the 200 ms with no step while r1 was away (the 10 ms step that recomputed r1 ends it).
    r3_causes = [e.attributes[sc.LLM_STALL_CAUSE] for e in stall_events(harness.trace("r3", T0))]
    assert r3_causes == ["preemption", "idle", "idle"]


def test_a_request_left_out_of_steps_is_skipped(harness):
    """Two steps run only r2 while r1 is running (a token budget spent elsewhere)."""
    t = harness.tracker
    t.queued("r1", ts=T0, prompt_tokens=2)
    t.queued("r2", ts=T0, prompt_tokens=2)
    t.scheduled(["r1", "r2"], ts=T0)
    t.batch({"r1": 2, "r2": 2}, ts=T0)
    t.tokens(["r1", "r2"], ts=T0 + 0.005)
    ts = decode_steps(t, ["r1", "r2"], T0 + 0.005, 6)
    before = ts
    ts = decode_steps(t, ["r2"], ts, 3, step=0.006)
    ts = decode_steps(t, ["r1", "r2"], ts, 6)
    t.finished("r1", ts=ts)
    t.finished("r2", ts=ts)
    (event,) = stall_events(harness.trace("r1", T0))
    assert event.attributes[sc.LLM_STALL_CAUSE] == "skipped"
    assert event.attributes[sc.LLM_STALL_STEPS] == 4  # the three without it and the one that ended it
    assert event.attributes[sc.LLM_STALL_DURATION] == pytest.approx(3 * 0.006 + STEP)
    assert before < ts


def test_an_engine_that_hears_of_a_preemption_late_names_the_recompute(harness):
    """vLLM's frontend hears of a preemption with the request's next token, after its recompute: while
    r3's recompute chunks run, the tracker still has r3 decoding, so the engine says which tokens are a
    recompute (``batch(recompute=...)``); r1's slow steps are blamed on r3's recompute."""
    t = harness.tracker
    t.queued("r1", ts=T0, prompt_tokens=8)
    t.queued("r3", ts=T0, prompt_tokens=8)
    t.scheduled(["r1", "r3"], ts=T0)
    t.batch({"r1": 8, "r3": 8}, ts=T0)
    first = T0 + 0.005
    t.tokens(["r1", "r3"], ts=first)
    ts = decode_steps(t, ["r1", "r3"], first, 8)
    evicted = ts  # the engine preempts r3 and re-admits it at once; the tracker hears of it later
    t.batch({"r1": 1, "r3": 12}, ts=ts, recompute=["r3"])
    ts += 0.060
    t.tokens(["r1"], ts=ts)
    t.batch({"r1": 1, "r3": 5}, ts=ts, recompute=["r3"])
    ts += 0.030
    t.preempted(["r3"], ts=evicted)  # replayed with the token that ends the recompute
    t.scheduled(["r3"], ts=evicted)
    t.tokens(["r1", "r3"], ts=ts)
    end = decode_steps(t, ["r1", "r3"], ts, 8)
    t.finished("r1", ts=end)
    t.finished("r3", ts=end)
    events = stall_events(harness.trace("r1", T0))
    assert [e.attributes[sc.LLM_STALL_CAUSE] for e in events] == ["recompute", "recompute"]
    assert [e.attributes[sc.LLM_STALL_RECOMPUTE_TOKENS] for e in events] == [12, 5]
    assert all(e.attributes[sc.LLM_STALL_PREFILL_TOKENS] == 0 for e in events)
    assert all(tuple(e.attributes[sc.LLM_STALL_REQUESTS]) == ("r3",) for e in events)


def test_a_step_of_requests_the_tracker_does_not_know_yet_leaves_the_others_out(harness):
    """A step holds r2 and a prompt the tracker has not heard of yet (vLLM's frontend hears of a new
    request with its first token): as many requests as the tracker has running, but not r1. r1's gap
    runs over that step to the next one that holds it."""
    t = harness.tracker
    t.queued("r1", ts=T0, prompt_tokens=2)
    t.queued("r2", ts=T0, prompt_tokens=2)
    t.scheduled(["r1", "r2"], ts=T0)
    t.batch({"r1": 2, "r2": 2}, ts=T0)
    t.tokens(["r1", "r2"], ts=T0 + 0.005)
    ts = decode_steps(t, ["r1", "r2"], T0 + 0.005, 8)
    t.batch({"r2": 1, "x": 300}, ts=ts)
    ts += 0.040
    t.tokens(["r2"], ts=ts)
    ts = decode_steps(t, ["r1", "r2"], ts, 8)
    t.finished("r1", ts=ts)
    t.finished("r2", ts=ts)
    (event,) = stall_events(harness.trace("r1", T0))
    assert event.attributes[sc.LLM_STALL_CAUSE] == "prefill"
    assert event.attributes[sc.LLM_STALL_DURATION] == pytest.approx(0.040 + STEP)
    assert event.attributes[sc.LLM_STALL_STEPS] == 2
    assert tuple(event.attributes[sc.LLM_STALL_REQUESTS]) == ("x",)


def test_without_batch_there_are_no_stall_figures(harness):
    """An engine that never calls batch(): no stall attribute, event or metric (not zero: unknown)."""
    t = harness.tracker
    t.queued("r1", ts=T0)
    t.scheduled(["r1"], ts=T0)
    for k in range(1, 12):
        t.tokens(["r1"], ts=T0 + 0.005 * k + (0.2 if k == 6 else 0.0))
    t.finished("r1", ts=T0 + 1)
    tr = harness.trace("r1", T0)
    assert sc.LLM_STALLS not in tr.root.attributes and not stall_events(tr)
    assert sc.METRIC_STALLED not in harness.metrics()


@pytest.mark.in_process_only("argument errors are raised in the engine's process, whichever the mode")
@pytest.mark.parametrize(
    ("scheduled", "error", "words"),
    [
        (["r1"], TypeError, "mapping of request id"),
        ({"r1": 1.5}, TypeError, "must be ints, got 1.5"),
        ({"r1": "3"}, TypeError, "must be ints, got '3'"),
        ({"r1": -1}, ValueError, ">= 0"),
    ],
)
def test_bad_batches_say_what_to_pass(harness, scheduled, error, words):
    with pytest.raises(error, match=words):
        harness.tracker.batch(scheduled)


@pytest.mark.in_process_only("the log itself, in the engine's process")
def test_the_log_is_bounded_and_what_it_forgot_is_no_stall(harness):
    """A log of 4 steps (8 at most between trims): r1's early stall is past it, and the steps it forgot
    do not make one long gap either; a later stall inside it is found with its cause."""
    from otel_llm.hooks.batches import BatchLog

    t = harness.tracker
    t._batch_log = log = BatchLog(size=4)  # the tracker's own log, made small
    t.queued("r1", ts=T0)
    t.scheduled(["r1"], ts=T0)
    t.batch({"r1": 2}, ts=T0)
    t.tokens(["r1"], ts=T0 + 0.005)
    ts = decode_steps(t, ["r1"], T0 + 0.005, 3)
    ts = decode_steps(t, ["r1"], ts + 0.100, 1)  # 100 ms with no step: idle, but forgotten by the end
    ts = decode_steps(t, ["r1"], ts, 12)
    assert 4 <= len(log.steps) <= 8 and len(log.ends) == len(log.steps)
    t.queued("r2", ts=ts)
    t.scheduled(["r2"], ts=ts)
    t.batch({"r1": 1, "r2": 300}, ts=ts)
    t.tokens(["r1", "r2"], ts=ts + 0.080)
    end = decode_steps(t, ["r1", "r2"], ts + 0.080, 2)
    t.finished("r1", ts=end)
    t.finished("r2", ts=end)
    causes = [e.attributes[sc.LLM_STALL_CAUSE] for e in stall_events(harness.trace("r1", T0))]
    assert causes == ["prefill"]


def test_view_why_tells_the_stalls_from_the_files(tmp_path, capsys):
    """``otel-llm view FILE --why r1``: the totals, then each stall in words; r2 has none; a request of an
    engine that never called batch() says so."""
    from view_files import tracker_file

    from otel_llm.kit.cli import main

    path = tracker_file(tmp_path / "run", prefill_story)
    assert main(["view", str(path), "--why", "r1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "request r1: 1 stall (prefill 120 ms)"
    assert out[1] == (
        "  token 12 waited 120 ms: 1 other request prefilled 2,048 tokens in the same step (r2 2,048)"
    )
    assert main(["view", str(path), "--why", "r2"]) == 0
    assert capsys.readouterr().out.startswith("request r2: no stalls")

    def no_batches(t):
        t.queued("q", ts=T0)
        t.scheduled(["q"], ts=T0)
        t.tokens(["q"], ts=T0 + 0.01)
        t.finished("q", ts=T0 + 0.02)

    bare = tracker_file(tmp_path / "bare", no_batches)
    assert main(["view", str(bare), "--why", "q"]) == 0
    assert "no stall figures; the engine did not report its batches" in capsys.readouterr().out
