"""What a finished request cost the engine: its share of the time of every step that computed for it.

Needs the ``batch()`` log (``otel_llm.hooks.batches``); runs once per finished request, under the
tracker's lock. Times are monotonic seconds. The cost model (docs/lifecycle.md, "Engine time"):

- a step's time runs from its start (``batch()``) to its end (its ``tokens()`` call, ``tokens([])`` for
  a step that produced no token, else the next step's start), less any part of it that overlaps the
  step before (an engine that schedules a step while the previous one runs). The engine's busy time is
  their sum;
- a step's time is split among its requests in proportion to the tokens it computed for each (prompt,
  recompute, decode or speculative tokens alike). A request's engine time is the sum of its shares in
  the steps that held it while it ran (and in a step that began before a preemption and ended after it,
  if the step names it); the part in the steps from a rescheduling after a preemption to the token that
  follows it is its recompute time.

So the engine times of all the requests of the logged steps add up to the busy time of those steps.
Steps older than the log (the last ``BATCH_LOG_SIZE`` at least) are not counted.

The cost is per run of the request, not per step: the log keeps running sums of each step's time per
token (``BatchLog.weigh``), so the steps where the request computed one token cost two lookups per run.
Only the steps where it may have computed more or less than one token are looked at one by one: those of
its prefill and of each recompute, the speculative steps, and the steps that left a running request out.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from itertools import compress, repeat
from operator import attrgetter, not_
from typing import Any

from otel_llm.hooks.batches import BatchLog, BatchStep
from otel_llm.hooks.timeline import FinishedRequest

_START = attrgetter("start")

EngineTime = tuple[float, float]
"""(seconds of engine time, of which recomputing after preemptions)."""


def engine_time(fin: FinishedRequest, log: BatchLog) -> EngineTime:
    """The request's engine time and its recompute part, over the steps the log holds. Caller holds the
    tracker's lock."""
    tl = fin.timeline
    first = tl.first_scheduled
    if first is None:
        return 0.0, 0.0  # never scheduled: no step computed for it
    rid = tl.request_id
    total = recompute = 0.0
    done = 0  # the steps (by index) counted so far: a step over a preemption and a rescheduling counts once
    for start, stop, heavy_end, recomputing, evicted in _runs(fin, first):
        share, heavy, done = _run(log, rid, start, stop, heavy_end, evicted, done)
        total += share
        if recomputing:
            recompute += heavy
    return total, recompute


def _runs(fin: FinishedRequest, first: float) -> Iterator[tuple[float, float, float | None, bool, bool]]:
    """The stretches the request ran, as (start, end, end of its heavy part, is it a recompute, does a
    preemption end it): from its first scheduling, and from each rescheduling, to the next preemption or
    its last token (its finish when no token came after the run began: a prompt or recompute cut short).
    The heavy part is where it may have computed many tokens a step: its prompt, up to its first token,
    or its recompute, up to the token that follows the rescheduling (None: to the run's end)."""
    start, heavy, recomputing = first, fin.timeline.first_token, False
    for p in fin.timeline.preemptions:
        yield start, p.preempted, heavy, recomputing, True
        if p.rescheduled is None:
            return  # evicted to the end
        start, heavy, recomputing = p.rescheduled, p.recomputed, True
    last = fin.last_token
    yield start, last if last is not None and last > start else fin.finished, heavy, recomputing, False


def _tokens_in(step: BatchStep, rid: Any) -> int | None:
    """The tokens the step computed for ``rid`` when other than one (None: one, or none if the step left
    it out). The pairs become a dict at the first lookup, shared by every request that finishes later."""
    counts = step.counts
    if not counts:
        return None
    if counts.__class__ is not dict:
        counts = step.counts = dict(counts)
    return counts.get(rid)


def _run(
    log: BatchLog, rid: Any, start: float, stop: float, heavy_end: float | None, evicted: bool, done: int
) -> tuple[float, float, int]:
    """The request's share of the steps that ended after ``start`` and by ``stop``, and of that the share
    in its heavy part; and the index after the last step counted. Steps before index ``done`` are counted
    already. A run that a preemption ends (``evicted``) also takes the steps that began before the
    preemption and ended after it, where they name the request: an engine that schedules a step while
    the one before runs (SGLang's overlap scheduler) evicts a request while a step that holds it runs."""
    ends = log.ends
    lo = max(bisect_right(ends, start), done)
    hi = bisect_right(ends, stop)
    over = hi
    if evicted:  # the steps that began before it and have ended (an unended one's end is inf)
        over = min(bisect_left(log.steps, stop, hi, key=_START), bisect_left(ends, math.inf, hi))
    if max(hi, over) <= lo:
        return 0.0, 0.0, done
    log.weigh(max(hi, over))
    weights, steps = log.weights, log.steps
    share = heavy = 0.0
    if hi > lo:
        share, heavy = _share(log, rid, lo, hi, stop, heavy_end)
    for i in range(max(lo, hi), over):  # over the preemption: only a step that names it
        step = steps[i]
        if step.members is not None and rid in step.members:
            n = _tokens_in(step, rid) or 1
            share += n * weights[i]
            if heavy_end is None or ends[i] <= heavy_end:
                heavy += n * weights[i]
    return share, heavy, max(hi, over)


def _share(log: BatchLog, rid: Any, lo: int, hi: int, stop: float, heavy_end: float | None) -> EngineTime:
    """The request's share of the steps of index ``lo`` to ``hi - 1`` (weighed), which it ran in, and
    of that the share in its heavy part (up to ``heavy_end``)."""
    ends, weights, cum = log.ends, log.weights, log.cum
    # One token in every step, then what differs: the steps that left it out, and its other counts.
    share = cum[hi] - cum[lo]
    base = log.base
    numbers = log.partial_numbers
    i0, i1 = bisect_left(numbers, base + lo), bisect_left(numbers, base + hi)
    if i1 > i0:
        held = map(frozenset.__contains__, log.partial_members[i0:i1], repeat(rid))
        share -= sum(weights[n - base] for n in compress(numbers[i0:i1], map(not_, held)))
    mid = hi if heavy_end is None or heavy_end >= stop else max(lo, bisect_right(ends, heavy_end, lo, hi))
    steps = log.steps
    heavy = 0.0
    for i in range(lo, mid):  # its prompt or recompute: a few steps (chunks), one by one
        step = steps[i]
        n = _tokens_in(step, rid)
        if n is None:
            if step.holds(rid):
                heavy += weights[i]
            continue
        share += (n - 1) * weights[i]
        heavy += n * weights[i]
    spec = log.spec_numbers
    for number in spec[bisect_left(spec, base + mid) : bisect_left(spec, base + hi)]:
        n = _tokens_in(steps[number - base], rid)
        if n is not None:
            share += (n - 1) * weights[number - base]
    return share, heavy
