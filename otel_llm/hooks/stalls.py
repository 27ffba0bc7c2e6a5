"""Why a request's tokens stalled: its gaps that stand out, each with a cause from the steps in it.

Needs the ``batch()`` log (``otel_llm.hooks.batches``); runs once per finished request, on the thread
that finished it, over a copy of the steps between its first and last token. Times are monotonic
seconds. The rule (docs/lifecycle.md, "Stalls"):

- a request's token times are F, then the end of every logged step after F that held it while it was
  decoding, and T_k after each preemption; its gaps are the differences of consecutive ones, and the
  gap from the last token before P_k to T_k is its preemption's. Steps older than the log are not
  looked at (nor is the gap to the oldest logged one);
- its typical gap is the median of the decode gaps (preemptions' gaps left out; past ``EXACT_GAPS`` of
  them, the median of about ``EXACT_GAPS`` taken evenly across them); a gap is a stall when it is at least
  ``STALL_RATIO`` times the typical gap and at least ``STALL_FLOOR_S``;
- a stall's cause, from the steps that ended inside it: ``preemption`` (its own; the gap over P_k), else
  ``idle`` when the steps cover less than half of it (the engine ran no step), else ``prefill`` or
  ``recompute`` when other requests' prefill / recompute tokens in those steps outnumber their decode
  tokens (the larger of the two), else ``skipped`` when some of the steps did not hold it (the engine
  busy with others), else ``slow_step``: the step that held it ran long itself, with nothing in it to
  blame (a busy machine, a pause). Each row also gives the longest step's own time and the typical gap.

The cost is per stall, not per step (``find_logged``): the log keeps each step's gap and the steps by
the class of their gap (``BatchLog.at_least``), so a request's gaps that stand out are found among the
classes above its threshold, and each step's explanation is worked out once for every request held in
it. A request that some step in its runs left out takes the exact path over its token times (``find``).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from itertools import chain, compress, repeat
from operator import add, itemgetter, sub
from typing import Any

from otel_llm import semconv as sc
from otel_llm.hooks.batches import PREFILL, BatchLog, BatchStep
from otel_llm.hooks.timeline import FinishedRequest
from otel_llm.record import MAX_STALL_ROWS, StallRow, Stalls

STALL_RATIO = 3.0  # a stall is at least this many typical gaps...
STALL_FLOOR_S = 0.002  # ...and at least this long (seconds): sub-millisecond jitter is no stall
MAX_NAMED = 3  # requests named per stall, the largest by tokens first
EXACT_GAPS = 256  # decode gaps up to which the typical gap is their exact median
_NOBODY: frozenset[Any] = frozenset()
# A step's shared explanation (``_explain_step``): its cause, and the requests with prefill or recompute.
_CAUSE, _HEAVY = itemgetter(0), itemgetter(7)

CAUSE_PREEMPTION, CAUSE_PREFILL, CAUSE_RECOMPUTE = sc.STALL_PREEMPTION, sc.STALL_PREFILL, sc.STALL_RECOMPUTE
CAUSE_IDLE, CAUSE_SKIPPED, CAUSE_SLOW_STEP = sc.STALL_IDLE, sc.STALL_SKIPPED, sc.STALL_SLOW_STEP


def _windows(fin: FinishedRequest) -> Iterator[tuple[float, float, int, bool]]:
    """The request's decode runs as (first token time, last token time, the first's number, False), and
    the gap over each preemption after its first token as (token before P_k, T_k, T_k's number, True)."""
    tl = fin.timeline
    first, last = tl.first_token, fin.last_token
    if first is None or last is None:
        return
    begin: float | None = first
    number = 1
    for p in tl.preemptions:
        if p.last_token is None:
            continue  # preempted before its first token: prefill's, not a gap between tokens
        if begin is not None:
            yield begin, p.last_token, number, False
        begin, number = p.recomputed, p.output_tokens + 1
        if begin is not None:
            yield p.last_token, begin, number, True
    if begin is not None:
        yield begin, last, number, False


def _token_times(
    rid: Any, w0: float, w1: float, ends: list[float], partial: list[BatchStep], logged: bool
) -> list[float]:
    """w0, then the ends of the steps in (w0, w1] that held the request (``partial``: the steps that did
    not hold every running request). ``logged``: whether the log reaches back to w0; if not, w0 is left
    out, so the steps the log forgot never make one long gap."""
    inside = ends[bisect_right(ends, w0) : bisect_right(ends, w1)]
    times = [w0, *inside] if logged else inside
    for step in partial:
        end = step.end  # set: the partial steps are ended ones
        if end is not None and w0 < end <= w1 and not step.holds(rid):
            k = bisect_left(times, end)
            if k < len(times) and times[k] == end:
                del times[k]
    return times


def find(
    fin: FinishedRequest,
    steps: list[BatchStep],
    ends: list[float],
    partial: list[BatchStep],
    log_start: float | None,
) -> Stalls:
    """The request's stalls: (totals, rows) as ``otel_llm.record.Stalls`` describes.

    ``steps`` / ``ends`` / ``partial``: the logged steps that ended between its first and last token,
    their ends, and those that left a running request out (``BatchLog.between``); ``log_start``: when
    the log's oldest step began (None: empty), so that a gap older than the log is ``unknown``. Per
    step, the work is C-level (slices, ``map``, ``sorted``); only the stalls are looked at one by one."""
    rid = fin.timeline.request_id
    runs: list[tuple[list[float], list[float], int]] = []  # (token times, their gaps, first number)
    over: list[tuple[float, float, int]] = []  # the preemptions' gaps
    for w0, w1, number, preemption in _windows(fin):
        if preemption:
            over.append((w0, w1, number))
            continue
        logged = log_start is not None and log_start <= w0
        times = _token_times(rid, w0, w1, ends, partial, logged)
        runs.append((times, list(map(sub, times[1:], times[:-1])), number))
    decode = sorted(chain.from_iterable(gaps for _, gaps, _ in runs))
    typical = decode[len(decode) // 2] if decode else 0.0
    threshold = max(STALL_RATIO * typical, STALL_FLOOR_S)
    found: list[tuple[float, float, int, bool]] = [
        (t0, t1, n, True) for t0, t1, n in over if t1 - t0 >= threshold
    ]
    for times, gaps, number in runs:
        for k in compress(range(len(gaps)), map(threshold.__le__, gaps)):
            found.append((times[k], times[k + 1], number + k + 1, False))
    found.sort()
    rows: list[StallRow] = []
    totals: dict[str, list[Any]] = {}
    for t0, t1, number, preemption in found:
        if preemption:
            row: StallRow = (t0, t1, CAUSE_PREEMPTION, number, 0, 0, 0, 0, (), 0.0, typical)
        else:
            inside = steps[bisect_right(ends, t0) : bisect_right(ends, t1)]
            row = _explain(rid, t0, t1, number, inside, typical)
        rows.append(row)
        total = totals.setdefault(row[2], [row[2], 0, 0.0])
        total[1] += 1
        total[2] += t1 - t0
    if len(rows) > MAX_STALL_ROWS:  # the longest, in time order
        keep = sorted(range(len(rows)), key=lambda k: rows[k][1] - rows[k][0], reverse=True)[:MAX_STALL_ROWS]
        rows = [rows[k] for k in sorted(keep)]
    return tuple((c, n, s) for c, n, s in totals.values()), tuple(rows)


def find_logged(fin: FinishedRequest, log: BatchLog) -> Stalls | None:
    """The request's stalls as ``find`` works them out, from the log itself, at a cost per stall; None when
    a step in one of its runs left it out (then ``find``, over its token times). Caller holds the
    tracker's lock.

    A stall that is one step's gap (the common one) takes its explanation from the log, worked out by the
    first request that stalled on that step; its totals and the longest rows are found with passes at C
    speed over those stalls. The others (a preemption's gap, a run's first gap) are explained one by one."""
    rid = fin.timeline.request_id
    steps, ends, gaps = log.steps, log.ends, log.gaps
    log_start = steps[0].start if steps else None
    runs: list[tuple[float, int, int, bool, int]] = []  # (start, lo, hi, logged, first number)
    over: list[tuple[float, float, int]] = []
    count = 0
    for w0, w1, number, preemption in _windows(fin):
        if preemption:
            over.append((w0, w1, number))
            continue
        lo, hi = bisect_right(ends, w0), bisect_right(ends, w1)
        if log.partials and not log.all_hold(rid, lo, hi):
            return None
        logged = log_start is not None and log_start <= w0
        runs.append((w0, lo, hi, logged, number))
        if hi > lo:
            count += hi - lo - (not logged)
    if runs:
        log.index(max(run[2] for run in runs))
    # The typical gap: each run's first gap (from its start to its first step's end), then the gaps of
    # its steps after the first; past EXACT_GAPS in all, every stride-th of the latter.
    stride = 1 if count <= EXACT_GAPS else count // EXACT_GAPS + 1
    decode: list[float] = []
    for w0, lo, hi, logged, _ in runs:
        if hi > lo:
            if logged:
                decode.append(ends[lo] - w0)
            decode.extend(gaps[lo + 1 : hi : stride])
    decode.sort()
    typical = decode[len(decode) // 2] if decode else 0.0
    threshold = max(STALL_RATIO * typical, STALL_FLOOR_S)
    # Stalls explained one by one, as rows: the preemptions' gaps, and each run's first gap.
    rows: list[StallRow] = [
        (t0, t1, CAUSE_PREEMPTION, n, 0, 0, 0, 0, (), 0.0, typical)
        for t0, t1, n in over
        if t1 - t0 >= threshold
    ]
    inner: list[int] = []  # the stalls that are a step's gap: that step's index
    shifts: list[tuple[int, int]] = []  # (a run's first index, what turns an index into a token number)
    for w0, lo, hi, logged, number in runs:
        if hi <= lo:
            continue
        shift = number - lo + logged  # the token number of the gap that ends at step i: i + shift
        if logged and ends[lo] - w0 >= threshold:
            inside = steps[lo : bisect_right(ends, ends[lo])]
            rows.append(_explain(rid, w0, ends[lo], lo + shift, inside, typical))
        shifts.append((lo, shift))
        inner.extend(log.at_least(threshold, lo + 1, hi))
    base, explained = log.base, log.explained
    shared: list[Any] = list(map(explained.get, map(add, inner, repeat(base))))
    if None in shared:  # steps no request stalled on yet: explained here, once for every request
        for k in compress(range(len(inner)), map(_is_none, shared)):
            shared[k] = explained[base + inner[k]] = _explain_step(steps, ends, inner[k])
    own: list[int] = []
    if False in shared or any(map(_HEAVY, shared)):
        own = [k for k, e in enumerate(shared) if e is False or rid in e[7]]
    if own:  # steps that left a running request out, or hold its own prefill or recompute: its rows
        for k in own:
            i = inner[k]
            t0, t1 = ends[i - 1], ends[i]
            inside = steps[bisect_right(ends, t0) : bisect_right(ends, t1)]
            rows.append(_explain(rid, t0, t1, i + _shift(shifts, i), inside, typical))
        mine = set(own)
        keep = [k not in mine for k in range(len(inner))]
        inner, shared = list(compress(inner, keep)), list(compress(shared, keep))
    # Totals: the rows', then the shared stalls' by cause (one pass per cause among them); by cause in
    # the order of each one's first stall.
    totals: dict[str, list[Any]] = {}
    first: dict[str, float] = {}
    for row in rows:
        total = totals.setdefault(row[2], [row[2], 0, 0.0])
        total[1] += 1
        total[2] += row[1] - row[0]
        first[row[2]] = min(first.get(row[2], math.inf), row[0])
    durations = list(map(gaps.__getitem__, inner))
    causes = list(map(_CAUSE, shared))
    for cause in set(causes):
        first[cause] = min(first.get(cause, math.inf), ends[inner[causes.index(cause)] - 1])
        total = totals.setdefault(cause, [cause, 0, 0.0])
        if len(causes) > 1 and causes.count(cause) != len(causes):
            total[1] += causes.count(cause)
            total[2] += sum(compress(durations, map(cause.__eq__, causes)))
        else:
            total[1] += len(causes)
            total[2] += sum(durations)
    # Rows of the shared stalls: the longest MAX_STALL_ROWS (the earliest first among equals), at most.
    chosen: list[int] | range = range(len(inner))
    if len(inner) > MAX_STALL_ROWS:
        chosen = sorted(sorted(chosen, key=durations.__getitem__, reverse=True)[:MAX_STALL_ROWS])
    for k in chosen:
        i = inner[k]
        cause, prefill, recompute, decode_tokens, count_steps, named, step_s, _ = shared[k]
        rows.append(
            (
                ends[i - 1],
                ends[i],
                cause,
                i + _shift(shifts, i),
                prefill,
                recompute,
                decode_tokens,
                count_steps,
                named,
                step_s,
                typical,
            )
        )
    rows.sort()
    if len(rows) > MAX_STALL_ROWS:  # the longest, in time order
        keep_rows = sorted(range(len(rows)), key=lambda k: rows[k][1] - rows[k][0], reverse=True)
        rows = [rows[k] for k in sorted(keep_rows[:MAX_STALL_ROWS])]
    ordered = sorted(totals.values(), key=lambda total: first[total[0]])
    return tuple((c, n, s) for c, n, s in ordered), tuple(rows)


def _is_none(value: Any) -> bool:
    return value is None


def _shift(shifts: list[tuple[int, int]], i: int) -> int:
    """What turns step index ``i`` into a token number: its run's (runs are in index order)."""
    k = bisect_right(shifts, (i, math.inf)) - 1
    return shifts[k][1]


def _explain_step(steps: list[BatchStep], ends: list[float], i: int) -> Any:
    """The explanation of the gap that ends at step ``i`` for any request held in the steps inside it and
    not among their prefill or recompute work: (cause, prefill, recompute, decode, steps, named, the
    longest step's time) and the requests with such work; False when a step inside did not hold every
    running request."""
    t0, t1 = ends[i - 1], ends[i]
    inside = steps[bisect_right(ends, t0) : bisect_right(ends, t1)]
    if len(inside) == 1:  # the common one: a step alone in the gap, every running request in it
        step = inside[0]
        if step.members is not None:
            return False
        if not step.heavy:  # nothing to blame but the engine: idle or a slow step, as _explain says
            covered = step.end - max(step.start, t0)  # type: ignore[operator]
            cause = CAUSE_IDLE if covered < (t1 - t0) / 2 else CAUSE_SLOW_STEP
            took = step.end - step.start  # type: ignore[operator]
            return (cause, 0, 0, step.decode + step.spec, 1, (), took, _NOBODY)
    if any(s.members is not None for s in inside):
        return False
    row = _explain(None, t0, t1, 0, inside, 0.0)
    return (row[2], *row[4:10], frozenset(other for s in inside for other, _, _ in s.heavy))


def _explain(
    rid: Any, t0: float, t1: float, number: int, inside: list[BatchStep], typical: float
) -> StallRow:
    """One decode gap's row: ``inside``, the steps that ended inside (t0, t1], and what they computed;
    ``typical``: the request's typical gap."""
    prefill = recompute = decode = skipped = 0
    covered = took = 0.0
    by_request: dict[Any, int] = {}
    for s in inside:
        decode += s.decode + s.spec
        covered += s.end - max(s.start, t0)  # type: ignore[operator]
        took = max(took, s.end - s.start)  # type: ignore[operator]
        if not s.holds(rid):
            skipped += 1
        for other, n, kind in s.heavy:
            if other == rid:
                continue
            by_request[other] = by_request.get(other, 0) + n
            if kind == PREFILL:
                prefill += n
            else:
                recompute += n
    gap = t1 - t0
    if covered < gap / 2:
        cause = CAUSE_IDLE
    elif prefill + recompute > decode:
        cause = CAUSE_PREFILL if prefill >= recompute else CAUSE_RECOMPUTE
    elif skipped:
        cause = CAUSE_SKIPPED
    else:  # it was in every step, and they ran most of the gap: the step itself was slow
        cause = CAUSE_SLOW_STEP
    named = sorted(by_request.items(), key=lambda item: item[1], reverse=True)[:MAX_NAMED]
    return (
        t0,
        t1,
        cause,
        number,
        prefill,
        recompute,
        decode,
        len(inside),
        tuple((str(other), n) for other, n in named),
        took,
        typical,
    )
