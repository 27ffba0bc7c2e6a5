"""Trace detail levels, and the engine steps the hook side remembers for the ``steps`` level.

Three levels, one setting (``RequestTracker(trace_detail=...)`` or ``OTEL_LLM_TRACE_DETAIL``):

- ``request``: one ``llm.request`` span per request, with its latency attributes and events (vLLM's shape);
- ``phases`` (the default): ``llm.request`` with its phase and preemption spans (docs/lifecycle.md);
- ``steps``: ``phases`` plus ``llm.engine.step`` spans under ``llm.prefill`` / ``llm.decode``: the engine
  steps (``tokens()`` calls) taken while the request was in the running batch, each from the previous
  step to its own tokens event; and the engine's steps in traces of their own, linked both ways with the
  requests' (``otel_llm.hooks.step_windows``).

Volume is bounded twice: the tracker remembers the last ``STEP_LOG_SIZE`` steps (one record per
``tokens()`` call, shared by the whole batch, so the hot path gains one append per step, none per
request), and a request gets spans for at most ``MAX_STEP_SPANS`` of its steps: the longest ones, the
steps that explain its latency. ``llm.request`` then carries ``llm.engine.steps`` (steps it ran in, as
far as the log reaches) and ``llm.engine.steps.unspanned`` (how many of them got no span).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from otel_llm.hooks.batches import BatchLog
from otel_llm.hooks.step_windows import OpenWindow, StepWindows
from otel_llm.hooks.timeline import FinishedRequest
from otel_llm.record import DETAIL_PHASES, DETAILS, MAX_STEP_SPANS, StepRow

ENV_TRACE_DETAIL = "OTEL_LLM_TRACE_DETAIL"

STEP_LOG_SIZE = 4096  # engine steps remembered (about 4096 * 100 bytes)


def resolve_detail(value: str | None) -> str:
    """The detail level to use: ``value``, else ``OTEL_LLM_TRACE_DETAIL``, else ``phases``."""
    source = "trace_detail"  # the tracker's argument
    if value is None:
        value = os.environ.get(ENV_TRACE_DETAIL, "").strip().lower() or DETAIL_PHASES
        source = ENV_TRACE_DETAIL
    if value not in DETAILS:
        raise ValueError(f"{source} must be one of {', '.join(DETAILS)}; got {value!r}")
    return value


class StepRecord:
    """One engine step as the tracker saw it: its tokens event (monotonic seconds), its index among the
    tracker's tokens() calls, the requests that produced tokens, and what ``engine_state()`` said; for a
    step with a span of its own (``otel_llm.hooks.step_windows``), that span's start, id and window, and
    the requests it links to."""

    __slots__ = (
        "batch_size",
        "composition",
        "index",
        "kv_cache_usage",
        "links",
        "span_id",
        "start",
        "tokens",
        "ts",
        "window",
    )

    def __init__(self, ts: float, index: int, batch_size: int) -> None:
        self.ts = ts
        self.index = index
        self.batch_size = batch_size
        self.tokens: int | None = None  # tokens fed to the model in the step, from engine_state()
        self.kv_cache_usage: float | None = None
        self.span_id: int | None = None  # set by StepWindows.add for a step with an engine span
        self.window: OpenWindow | None = None
        self.start = ts
        self.links: tuple[Any, ...] = ()  # the Timelines (or None) of the requests it links to
        self.composition: tuple[int, int, int, int] | None = None  # prefill, recompute, decode, spec tokens


class StepLog:
    """The last ``size`` engine steps, in time order, and their windows (``windows``: the engine's own
    step spans; None: none)."""

    def __init__(self, size: int = STEP_LOG_SIZE, windows: StepWindows | None = None) -> None:
        self.records: deque[StepRecord] = deque(maxlen=size)
        self.windows = windows

    def add(
        self,
        ts: float,
        index: int,
        batch_size: int,
        ids: Sequence[Any],
        get: Callable[[Any], Any],
        batches: BatchLog | None,
    ) -> None:
        """One tokens() call, for the requests ``ids`` (``get``: the registry's lookup; ``batches``: the
        tracker's batch log or None). Caller holds the tracker's lock."""
        records = self.records
        record = StepRecord(ts, index, batch_size)
        if self.windows is not None:
            before = records[-1].ts if records else ts
            self.windows.add(record, before if before <= ts else ts, ids, get, batches)
        records.append(record)

    def latest(self) -> StepRecord | None:
        return self.records[-1] if self.records else None

    def note_state(self, tokens: int | None, kv_cache_usage: float | None) -> None:
        """What ``engine_state()`` reported after the latest step (None: not reported). Caller holds the
        tracker's lock."""
        latest = self.latest()
        if latest is not None:
            latest.tokens = tokens if tokens is not None else latest.tokens
            latest.kv_cache_usage = kv_cache_usage if kv_cache_usage is not None else latest.kv_cache_usage

    def since(self, start: float | None) -> list[StepRecord]:
        """A copy of the logged steps from the last one at or before ``start`` (monotonic seconds) on.
        Caller holds the tracker's lock: the engine thread appends while requests finish elsewhere."""
        if start is None:
            return []
        tail: list[StepRecord] = []
        for record in reversed(self.records):
            tail.append(record)
            if record.ts <= start:
                break
        tail.reverse()
        return tail


def of_request(fin: FinishedRequest, recent: list[StepRecord]) -> list[tuple[float, StepRecord]]:
    """(span start, step) for each of ``recent`` taken while the request was running, in time order.

    Running windows: [S1, P_1], [R_1, P_2], ... up to the last tokens event L. A step belongs to a window
    when its tokens event is inside it (bounds included); its span starts at the previous
    logged step, or at the window's start when that is later."""
    last = fin.last_token
    if fin.timeline.first_scheduled is None or last is None:
        return []
    windows = list(_windows(fin, last))
    out: list[tuple[float, StepRecord]] = []
    prev_ts: float | None = None
    for record in recent:
        ts = record.ts
        for lo, hi in windows:
            if lo <= ts <= hi:
                out.append((lo if prev_ts is None or prev_ts < lo else prev_ts, record))
                break
        prev_ts = ts
    return out


def _windows(fin: FinishedRequest, last: float) -> Iterator[tuple[float, float]]:
    tl = fin.timeline
    begin: float | None = tl.first_scheduled
    for p in tl.preemptions:
        if begin is not None:
            yield begin, min(p.preempted, last)
        begin = p.rescheduled
    if begin is not None:
        yield begin, last


def longest(steps: list[tuple[float, StepRecord]], cap: int) -> list[tuple[float, StepRecord]]:
    """At most ``cap`` of ``steps``: the longest, kept in time order."""
    if len(steps) <= cap:
        return steps
    chosen = sorted(range(len(steps)), key=lambda i: steps[i][1].ts - steps[i][0], reverse=True)[:cap]
    return [steps[i] for i in sorted(chosen)]


def rows(fin: FinishedRequest, recent: list[StepRecord]) -> tuple[int, tuple[StepRow, ...]]:
    """The record's ``steps``: how many logged steps the request ran in, and the longest
    ``MAX_STEP_SPANS`` of them as plain rows (``otel_llm.record.StepRow``), in time order."""
    steps = of_request(fin, recent)
    chosen = longest(steps, MAX_STEP_SPANS)
    return len(steps), tuple(
        (
            t0,
            r.ts,
            r.index,
            r.batch_size,
            r.tokens,
            r.kv_cache_usage,
            None if r.window is None else r.window.trace_id,
            r.span_id,
        )
        for t0, r in chosen
    )
