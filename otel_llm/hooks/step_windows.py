"""The engine's own steps as spans (trace detail ``steps``): one trace per engine and time window.

A request's ``llm.engine.step`` spans say how long each step it ran in took; they cannot say what else
the step held. So at detail ``steps`` the tracker also gives the engine's steps spans of their own, in
a trace per tracker (one engine) and window of time:

    llm.engine.window [first step's start, last step's tokens event]
    └─ llm.engine.step [step start, its tokens event]  one per step, at most STEP_SPANS_PER_WINDOW

A step starts where ``batch()`` said it began, else at the previous tokens event (the first step of a
tracker without ``batch()``: at its own, a span of no length).

Each engine step span links to the ``llm.request`` span of every request that produced tokens in it
(at most ``MAX_STEP_LINKS``), and a request's own ``llm.engine.step`` span links back to the engine's
(``RequestRecord.steps`` rows carry its ids): from a stalled request to the step, and from the step to
every request in it.

A window opens with the first step after the previous one closed and closes at the first step
``STEP_WINDOW_S`` seconds after its first, or when its tracker is flushed. Volume is bounded: the first
``STEP_SPANS_PER_WINDOW`` steps of a window get spans (ids drawn at the step, so a request finishing
while its window is open can link to them); the others are only counted (``llm.engine.steps`` and
``llm.engine.steps.unspanned`` on ``llm.engine.window``). The hot path pays, per step, one comparison
and a counter, and per spanned step a span id and one C-level pass over the step's requests (their
timelines, read for their span ids when the window is handed over); measured in BENCHMARKS.md,
section 1, "detail steps".

Closed windows wait here, at most ``MAX_CLOSED``, for the consumer to take them
(``Producer.step_windows``): the export channel's sender every tick, an in-process emitter as requests
finish and at a flush. Everything here but ``plain``: caller holds the tracker's lock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from otel_llm.record import StepWindow

if TYPE_CHECKING:
    from otel_llm.hooks.batches import BatchLog
    from otel_llm.hooks.steps import StepRecord

STEP_WINDOW_S = 10.0  # seconds of engine steps per window trace
STEP_SPANS_PER_WINDOW = 128  # steps with a span of their own per window; the rest are counted
MAX_STEP_LINKS = 128  # requests linked from one step span (the SDK's default link limit)
MAX_CLOSED = 4  # closed windows kept for the consumer; past it the oldest is dropped (``dropped``)


class OpenWindow:
    """A window being filled: its trace id and root span id (drawn when it opens), its first step's
    start and the time it closes by (monotonic seconds), its steps and the ones with spans."""

    __slots__ = ("end", "span_id", "spanned", "start", "steps", "trace_id", "until")

    def __init__(self, trace_id: int, span_id: int, start: float, until: float) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.start = start
        self.end = start
        self.until = until
        self.steps = 0
        self.spanned: list[StepRecord] = []


class StepWindows:
    """The open window, and the closed ones the consumer has not taken yet.

    ``new_ids()``: a new (trace id, span id) pair; ``new_span_id(trace_id)``: a span id in that trace
    (both from the tracer provider's id generator, as the request's ids are)."""

    def __init__(
        self,
        new_ids: Callable[[], tuple[int, int]],
        new_span_id: Callable[[int], int],
        window_s: float = STEP_WINDOW_S,
        cap: int = STEP_SPANS_PER_WINDOW,
    ) -> None:
        self._new_ids = new_ids
        self._new_span_id = new_span_id
        self.window_s = window_s
        self.cap = cap
        self.open: OpenWindow | None = None
        self.closed: list[OpenWindow] = []
        self.dropped = 0  # closed windows lost because the consumer did not take them in time

    def add(
        self,
        record: StepRecord,
        start: float,
        ids: Sequence[Any],
        get: Callable[[Any], Any],
        batches: BatchLog | None,
    ) -> None:
        """One step (``record``, whose span starts at ``start``, the previous tokens event, unless the
        engine said when it began), with the requests that produced tokens in it (``ids``; ``get``: the
        registry's lookup, id -> Timeline or None). ``batches``: the
        tracker's batch log (None: the engine does not report its batches), whose latest step, not yet
        ended, is this one: what it computed by kind, and the requests with prefill or recompute work
        in it (linked too: they produced no token, yet they are what the others waited behind)."""
        window = self.open
        ts = record.ts
        if window is None or ts >= window.until:
            if window is not None:
                self._close(window)
            trace_id, span_id = self._new_ids()
            window = self.open = OpenWindow(trace_id, span_id, min(start, ts), ts + self.window_s)
        window.steps += 1
        window.end = ts
        if len(window.spanned) < self.cap:
            record.start = start
            record.window = window
            record.span_id = self._new_span_id(window.trace_id)
            # The requests' timelines, not their ids: one C-level pass here; their span ids are read
            # when the window is handed over (they never change, and a finished request's stay).
            links = tuple(map(get, ids[:MAX_STEP_LINKS] if len(ids) > MAX_STEP_LINKS else ids))
            if batches is not None and batches.steps and batches.steps[-1].end is None:
                step = batches.steps[-1]
                record.start = min(step.start, ts)  # when the step began, as the engine said
                record.composition = (step.prefill, step.recompute, step.decode, step.spec)
                if step.heavy:  # first: past the cap, the requests the others waited behind stay
                    links = tuple(map(get, [rid for rid, _, _ in step.heavy])) + links
            record.links = links
            window.spanned.append(record)

    def take(self, final: bool) -> list[OpenWindow]:
        """The closed windows, and the open one too when ``final`` (a flush), forgotten here; ``plain``
        turns each into the record's form, without the tracker's lock."""
        if final and self.open is not None and self.open.steps:
            self._close(self.open)
            self.open = None
        windows, self.closed = self.closed, []
        return windows

    def _close(self, window: OpenWindow) -> None:
        closed = self.closed
        closed.append(window)
        if len(closed) > MAX_CLOSED:
            del closed[0]
            self.dropped += 1


def plain(window: OpenWindow) -> StepWindow:
    """``window`` as ``otel_llm.record.StepWindow``: each spanned step's links become the (trace id, span
    id) of the requests' ``llm.request`` spans, each once, at most ``MAX_STEP_LINKS``."""
    rows = tuple(
        (
            r.span_id,
            r.start,
            r.ts,
            r.index,
            r.batch_size,
            r.tokens,
            r.kv_cache_usage,
            tuple(dict.fromkeys((tl.trace_id, tl.span_id) for tl in r.links if tl is not None))[
                :MAX_STEP_LINKS
            ],
            r.composition,
        )
        for r in window.spanned
        if r.span_id is not None  # always: add() gave each spanned step its id
    )
    return (window.trace_id, window.span_id, window.start, window.end, window.steps, rows)
