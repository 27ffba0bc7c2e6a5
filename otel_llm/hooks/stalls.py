"""Why a request's tokens stalled: its gaps that stand out, each with a cause from the steps in it.

Needs the ``batch()`` log (``otel_llm.hooks.batches``); runs once per finished request, on the thread
that finished it, over a copy of the steps between its first and last token. Times are monotonic
seconds. The rule (docs/lifecycle.md, "Stalls"):

- a request's token times are F, then the end of every logged step after F that held it while it was
  decoding, and T_k after each preemption; its gaps are the differences of consecutive ones, and the
  gap from the last token before P_k to T_k is its preemption's. Steps older than the log are not
  looked at (nor is the gap to the oldest logged one);
- its typical gap is the median of the decode gaps (preemptions' gaps left out); a gap is a stall when it
  is at least ``STALL_RATIO`` times the typical gap and at least ``STALL_FLOOR_S``;
- a stall's cause, from the steps that ended inside it: ``preemption`` (its own; the gap over P_k), else
  ``idle`` when the steps cover less than half of it (the engine ran no step), else ``prefill`` or
  ``recompute`` when other requests' prefill / recompute tokens in those steps outnumber their decode
  tokens (the larger of the two), else ``skipped`` when some of the steps did not hold it (the engine
  busy with others), else ``unknown`` (a slow step with nothing to blame).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from itertools import chain, compress
from operator import sub
from typing import Any

from otel_llm import semconv as sc
from otel_llm.hooks.batches import PREFILL, BatchStep
from otel_llm.hooks.timeline import FinishedRequest
from otel_llm.record import MAX_STALL_ROWS, StallRow, Stalls

STALL_RATIO = 3.0  # a stall is at least this many typical gaps...
STALL_FLOOR_S = 0.002  # ...and at least this long (seconds): sub-millisecond jitter is no stall
MAX_NAMED = 3  # requests named per stall, the largest by tokens first

CAUSE_PREEMPTION, CAUSE_PREFILL, CAUSE_RECOMPUTE = sc.STALL_PREEMPTION, sc.STALL_PREFILL, sc.STALL_RECOMPUTE
CAUSE_IDLE, CAUSE_SKIPPED, CAUSE_UNKNOWN = sc.STALL_IDLE, sc.STALL_SKIPPED, sc.STALL_UNKNOWN


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
        if w0 < step.end <= w1 and not step.holds(rid):  # type: ignore[operator]
            k = bisect_left(times, step.end)  # type: ignore[arg-type]
            if k < len(times) and times[k] == step.end:
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
            row: StallRow = (t0, t1, CAUSE_PREEMPTION, number, 0, 0, 0, 0, ())
        else:
            inside = steps[bisect_right(ends, t0) : bisect_right(ends, t1)]
            row = _explain(rid, t0, t1, number, inside)
        rows.append(row)
        total = totals.setdefault(row[2], [row[2], 0, 0.0])
        total[1] += 1
        total[2] += t1 - t0
    if len(rows) > MAX_STALL_ROWS:  # the longest, in time order
        keep = sorted(range(len(rows)), key=lambda k: rows[k][1] - rows[k][0], reverse=True)[:MAX_STALL_ROWS]
        rows = [rows[k] for k in sorted(keep)]
    return tuple((c, n, s) for c, n, s in totals.values()), tuple(rows)


def _explain(rid: Any, t0: float, t1: float, number: int, inside: list[BatchStep]) -> StallRow:
    """One decode gap's row: ``inside``, the steps that ended inside (t0, t1], and what they computed."""
    prefill = recompute = decode = skipped = 0
    covered = 0.0
    by_request: dict[Any, int] = {}
    for s in inside:
        decode += s.decode + s.spec
        covered += s.end - max(s.start, t0)  # type: ignore[operator]
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
    else:
        cause = CAUSE_UNKNOWN
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
    )
