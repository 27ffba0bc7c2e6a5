"""The in-flight registry: one tracker's requests by id, and the bookkeeping its hooks share.

``RequestTracker`` (``otel_llm.tracker``) is this registry plus the hooks an engine calls. Here: the
requests in flight (oldest first), how many are in each state, the previous ``tokens()`` step and its
steady batch, the anomaly counts, and what every hook records an event with: the checked timestamp, the
clamp that keeps a request's events in order, scheduling, the tokens path for anything but the plain
continuation of the previous step, adding and ending requests, and giving up on those that never end
(closed as ``abandoned``). Only numbers are recorded
here; a request that ends is handed on (as its record, ``otel_llm.hooks.produce``) outside the lock.

Threads: the methods for one request's events take ``_lock`` themselves; the bookkeeping the hooks
share runs with it held by the caller (each section says which). Clock: ``time.monotonic()`` seconds.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from otel_llm import semconv as sc
from otel_llm.hooks import anomalies as an
from otel_llm.hooks.checks import check_cached_tokens
from otel_llm.hooks.recompute import reschedule
from otel_llm.hooks.timeline import PREEMPTED, RUNNING, WAITING, FinishedRequest, Preemption, Step, Timeline

_monotonic = time.monotonic
_INF = math.inf

NO_STEP = Step(-_INF, -1)  # "no previous tokens step": no request's step is this one, not even None
_NOTHING_DUE: list[FinishedRequest] = []  # shared, never appended to: what most calls find due

# A fork while another thread holds a registry's lock would leave the child's copy locked forever; the
# child gets fresh locks (its copy of the registry is only ever touched by its own threads).
_LIVE: weakref.WeakSet[InFlight] = weakref.WeakSet()


def _renew_locks_after_fork() -> None:
    for registry in list(_LIVE):
        registry._renew_lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks_after_fork)


class InFlight:
    """The requests of one tracker from ``queued`` until they finish, are handed off or abandoned.

    ``max_in_flight``: requests kept at most; past it the oldest is abandoned. ``max_age_s``: a request in
    flight longer than this (monotonic seconds since queued) is abandoned. The tracker sets ``_itl`` (the
    inter-token latency recorder the tokens path adds gaps to, under ``_lock``) and ``_finish`` (hands a
    finished request on, called without the lock), and has the ``scheduled`` hook.
    """

    _itl: Any
    _finish: Callable[[FinishedRequest], None]
    scheduled: Callable[..., None]

    def __init__(self, max_in_flight: int, max_age_s: float) -> None:
        self.max_in_flight = max_in_flight
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._inflight: dict[Any, Timeline] = {}
        self._states = [0, 0, 0]  # requests in flight by state: WAITING, RUNNING, PREEMPTED
        self._prev_step = NO_STEP  # the previous tokens() call
        # The request ids of the previous tokens() call (a copy) while every one of them points at
        # _prev_step and nothing else does; None when that does not hold (see RequestTracker.tokens).
        self._batch: list[Any] | tuple[Any, ...] | None = None
        self._anomalies = an.AnomalyCounter()
        self._abandoned = 0
        # Before this monotonic time no request can be past max_age_s (the oldest's limit, or earlier).
        self._next_due = -_INF
        _LIVE.add(self)

    def __contains__(self, request_id: object) -> bool:
        """Whether ``request_id`` is queued and not yet finished (or abandoned)."""
        return request_id in self._inflight

    @property
    def in_flight(self) -> int:
        """Number of requests queued and not yet finished."""
        return len(self._inflight)

    @property
    def anomaly_counts(self) -> dict[str, int]:
        """Lifecycle anomalies seen so far, by kind (also exported as ``otel_llm.anomalies``)."""
        with self._lock:
            return dict(self._anomalies.counts)

    # --- one request's events: each takes the lock, logs new anomalies, finishes what ended ------------

    def _add(self, tl: Timeline, problems: Iterable[str]) -> None:
        """queued(): a new request (unless its id is in flight already: counted, not replaced), after
        abandoning what makes room for it. ``problems``: the anomalies of its attributes."""
        request_id = tl.request_id
        abandoned: list[FinishedRequest] = []
        with self._lock:
            for kind in problems:
                self._anomalies.note(kind, request_id)
            if tl.arrival > tl.queued:
                self._anomalies.note(an.ARRIVAL_AFTER_QUEUED, request_id)
                tl.arrival = tl.queued
            if request_id in self._inflight:
                self._anomalies.note(an.DUPLICATE_QUEUED, request_id)
            else:
                abandoned = self._due_abandoned(tl.queued, incoming=1)
                self._inflight[request_id] = tl
                self._states[WAITING] += 1
        if self._anomalies.unlogged:
            self._anomalies.log_pending()
        self._finish_all(abandoned)

    def _close(self, request_id: Any, ts: float, reason: str, error: BaseException | str | None) -> None:
        """finished(): the request leaves the engine at E = ``ts`` (clamped); so do requests now overdue."""
        with self._lock:
            tl = self._inflight.pop(request_id, None)
            done = None
            self._batch = None  # its Step must not move on: its count and latest token are read from it
            if tl is None:
                self._anomalies.note(an.UNKNOWN_REQUEST, request_id)
            else:
                self._states[tl.state] -= 1
                done = FinishedRequest(tl, self._clamp(tl, ts), reason, error)
                abandoned = self._due_abandoned(ts, incoming=0)
        if self._anomalies.unlogged:
            self._anomalies.log_pending()
        if done is None:
            return
        self._finish(done)
        self._finish_all(abandoned)

    def _hand_off(self, request_id: Any, ts: float, num_bytes: int | None) -> None:
        """kv_sent(): the request leaves this (prefill) instance at K = ``ts`` (clamped) and ends here."""
        with self._lock:
            tl = self._inflight.pop(request_id, None)
            done = None
            self._batch = None  # its Step must not move on: its count and latest token are read from it
            if tl is None:
                self._anomalies.note(an.UNKNOWN_REQUEST, request_id)
            else:
                self._states[tl.state] -= 1
                at = self._clamp(tl, ts)
                tl.kv_done, tl.kv_bytes = at, num_bytes
                done = FinishedRequest(tl, at, sc.REASON_HANDED_OFF, None, handed_off=True)
        if self._anomalies.unlogged:
            self._anomalies.log_pending()
        if done is not None:
            self._finish(done)

    def _kv_received(self, request_id: Any, ts: float, num_bytes: int | None) -> None:
        """kv_received(): the request's KV cache is in this (decode) instance at K = ``ts`` (clamped)."""
        with self._lock:
            tl = self._inflight.get(request_id)
            if tl is None:
                self._anomalies.note(an.UNKNOWN_REQUEST, request_id)
            else:
                tl.kv_done = tl.last_event = self._clamp(tl, ts)
                tl.kv_bytes = num_bytes
        if self._anomalies.unlogged:
            self._anomalies.log_pending()

    def _scheduled_cached(self, request_ids: Sequence[Any], ts: float | None, cached: Sequence[int]) -> None:
        """scheduled() with a prefix-cache hit count per request."""
        ids, counts = check_cached_tokens(request_ids, cached)
        first: list[tuple[Timeline, int]] = []
        again: list[tuple[Timeline, Preemption, int]] = []
        with self._lock:
            for rid, n in zip(ids, counts):
                tl = self._inflight.get(rid)
                if tl is not None and tl.state == WAITING:
                    first.append((tl, n))
                elif tl is not None and tl.state == PREEMPTED:
                    again.append((tl, tl.preemptions[-1], n))
        self.scheduled(ids, ts)
        with self._lock:
            for tl, n in first:
                if tl.cached_tokens is None and tl.state == RUNNING:
                    tl.cached_tokens = n
            for tl, p, n in again:  # R_k: what the rescheduling cost in tokens (otel_llm.recompute)
                if p.rescheduled is None or p.cached_tokens is not None or tl.preemptions[-1] is not p:
                    continue  # not rescheduled by this call (odd input), or listed twice
                if not reschedule(p, tl.prompt_tokens, tl.output_tokens, n):
                    self._anomalies.note(an.CACHED_OVER_CONTEXT, tl.request_id)
        if self._anomalies.unlogged:
            self._anomalies.log_pending()

    def _close_overdue(self) -> None:
        """force_flush(): the requests past their maximum age are abandoned now."""
        with self._lock:
            abandoned = self._due_abandoned(_monotonic(), incoming=0)
        self._finish_all(abandoned)

    # --- shared by the hooks' bookkeeping (callers hold self._lock) ---------------------------------

    def _clamp(self, tl: Timeline, ts: float) -> float:
        """No event of a request is earlier than its previous one, so no duration is negative."""
        floor = tl.last_event
        step = tl.step  # its latest tokens event (tl.last_token, read without the property's call)
        if step is not None and step.ts > floor:
            floor = step.ts
        if ts < floor:
            self._anomalies.note(an.TIMESTAMP_REGRESSION, tl.request_id)
            return floor
        return ts

    def _schedule(self, tl: Timeline, ts: float) -> None:
        if tl.state == WAITING:
            tl.first_scheduled = ts
        else:  # PREEMPTED: this is R_k
            tl.preemptions[-1].rescheduled = ts
        self._states[tl.state] -= 1
        self._states[RUNNING] += 1
        tl.state = RUNNING
        tl.last_event = ts

    def _tokens_checked(self, rid: Any, tl: Timeline | None, step: Step, n: Any) -> int:
        """A tokens event that is not the plain continuation of the previous step.

        Returns 1 when the request is not left on ``step`` with one token per step from here (unknown,
        a bad count, a clamped timestamp, or listed twice in one call), else 0: the next call can only
        advance the whole batch at once when every request of it is on the shared step."""
        if tl is None:
            self._anomalies.note(an.UNKNOWN_REQUEST, rid)
            return 1
        if n.__class__ is not int or n <= 0:
            self._anomalies.note(an.BAD_TOKEN_COUNT, rid)
            return 1
        apart = 1 if tl.step is step else 0  # listed twice in this call
        ts = self._clamp(tl, step.ts)
        if ts != step.ts:
            apart = 1
            step = Step(ts, step.index)  # this request's own step: the next one takes this path again
        if tl.state != RUNNING:
            self._anomalies.note(an.TOKENS_BEFORE_SCHEDULED, rid)
            self._schedule(tl, ts)
        if tl.first_token is None:
            tl.first_token = ts  # F; it is also T_k of any preemption before it
        else:
            latest = tl.latest_token()
            if latest is not None:  # always: F is set, so a tokens event came before this one
                self._itl.add(ts - latest, 1)
        if tl.preemptions:
            last = tl.preemptions[-1]
            if last.rescheduled is not None and last.recomputed is None:
                last.recomputed = ts  # T_k
        tokens = tl.output_tokens + n
        tl.step = step
        tl.token_base = tokens - step.index
        tl.last_event = ts
        return apart

    def _due_abandoned(self, now: float, incoming: int) -> list[FinishedRequest]:
        """Pop requests past max_age_s, and the oldest while over max_in_flight (insertion order): the
        requests to close as abandoned.

        Called by every queued() and finished(): when the count leaves room and ``now`` is before the
        oldest request's age limit (as last seen: a request that finished since only makes it earlier),
        nothing is due, and the registry is not looked at. Finding the oldest costs more the more
        requests ended since the dict last compacted (it steps over their freed entries)."""
        inflight = self._inflight
        if now < self._next_due and len(inflight) + incoming <= self.max_in_flight:
            return _NOTHING_DUE
        if not inflight:
            return _NOTHING_DUE
        out: list[FinishedRequest] = []
        horizon = now - self.max_age_s
        while inflight:
            rid, tl = next(iter(inflight.items()))
            if tl.queued >= horizon and len(inflight) + incoming <= self.max_in_flight:
                self._next_due = tl.queued + self.max_age_s
                break
            del inflight[rid]
            self._batch = None
            self._states[tl.state] -= 1
            self._abandoned += 1
            out.append(FinishedRequest(tl, max(now, tl.last_event), sc.REASON_ABANDONED, None))
        else:
            self._next_due = -_INF  # empty: the next request sets it
        return out

    # --- without the lock ---------------------------------------------------------------------------

    def _timestamp(self, ts: Any) -> float:
        """``ts`` or now; NaN and infinities are replaced by now and counted. No lock needed."""
        if ts is None:
            return _monotonic()
        if ts.__class__ is not float:
            if isinstance(ts, bool) or not isinstance(ts, (int, float)):
                try:
                    ts = float(ts)  # numpy scalars and the like
                except (TypeError, ValueError):
                    raise TypeError(
                        f"ts must be time.monotonic() seconds (a float) or None, got {ts!r}"
                    ) from None
            ts = float(ts)
        if -_INF < ts < _INF:
            return ts
        with self._lock:
            self._anomalies.note(an.BAD_TIMESTAMP)
        self._anomalies.log_pending()
        return _monotonic()

    def _finish_all(self, done: list[FinishedRequest]) -> None:
        """Finish requests popped under the lock."""
        for fin in done:
            self._finish(fin)

    def _note(self, kind: str, request_id: Any) -> None:
        """Count an anomaly from outside the lock (a finished request's hand-on), and log it once."""
        with self._lock:
            self._anomalies.note(kind, request_id)
        self._anomalies.log_pending()

    def _renew_lock(self) -> None:
        """In a forked child: a fresh lock (the tracker hands it on to whatever shares it)."""
        self._lock = threading.Lock()
