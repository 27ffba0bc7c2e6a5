"""The requests one vLLM adapter follows, from vLLM's frontend registering them to their end.

A request is *pending* from ``request_added`` until its QUEUED event (or the first sign of one) opens it
on its tracker, then *live*: its engine-core events go to the tracker as they arrive (``replay``) until
it finishes, is handed off to a decode instance (``handoffs``), is abandoned, or its tracker lets it go.
The trackers close requests that never finish (``max_age_s``, ``max_in_flight``); ``prune`` follows
them, so what is kept here stays bounded by the same limits. Times are ``time.monotonic()`` seconds,
vLLM's engine-core clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterable, Mapping
from typing import Any

from opentelemetry import context as otel_context

from otel_llm import semconv as sc
from otel_llm.hooks.options import DEFAULT_MAX_AGE_S, DEFAULT_MAX_IN_FLIGHT
from otel_llm.integrations.vllm.choice_groups import ChoiceGroups
from otel_llm.integrations.vllm.choices import Choices
from otel_llm.integrations.vllm.handoffs import HandOffs
from otel_llm.integrations.vllm.identity import RequestIdentity
from otel_llm.integrations.vllm.reading import event_time
from otel_llm.integrations.vllm.rescheduling import Reschedulings

PendingEvents = Callable[[str], Iterable[Any] | None]
"""``pending_events(request_id)``: engine-core events of a request not delivered yet, or None."""


class Pending:
    """A request registered with the frontend whose QUEUED event has not arrived yet."""

    __slots__ = ("added", "arrival", "carrier", "choices", "identity", "prompt_tokens", "tracker")

    def __init__(
        self,
        arrival: float | None,
        prompt_tokens: int | None,
        carrier: Mapping[str, str] | None,
        identity: RequestIdentity,
        tracker: Any,
        choices: Choices | None,
    ) -> None:
        self.added = time.monotonic()  # when the frontend registered it (monotonic seconds)
        self.arrival = arrival  # monotonic seconds, or None when vLLM gave no arrival time
        self.prompt_tokens = prompt_tokens
        self.carrier = carrier
        self.identity = identity
        self.tracker = tracker
        self.choices = choices


class FollowedRequests:
    """One adapter's pending and live requests, the trackers they went to, their events and their ends."""

    def __init__(self, reschedulings: Reschedulings | None = None) -> None:
        """``reschedulings``: where a rescheduling's figure waits (forgotten when its request ends)."""
        self._reschedulings = reschedulings
        self.pending: dict[str, Pending] = {}  # insertion order: oldest first
        self.live: dict[str, Any] = {}  # queued with a tracker, not finished: request id -> tracker
        # Requests whose PREEMPTED event was replayed and whose next SCHEDULED (their rescheduling) not yet.
        self.evicted: set[str] = set()
        self.choices = ChoiceGroups()  # the llm.choices spans of n > 1 requests
        self.handoffs = HandOffs()  # disaggregated prefill's parts that go on at a decode instance
        self.trackers: dict[int, Any] = {}  # every tracker requests went to (per model, endpoint, role)
        self.engine_tracker: Any = None  # where the engine's state goes: the tracker of the first request
        self._max_age_s = DEFAULT_MAX_AGE_S
        self._max_pending = DEFAULT_MAX_IN_FLIGHT
        self._added = 0

    def add(self, request_id: str, pending: Pending) -> None:
        """Follow a request the frontend registered. A tracker not seen before joins the trackers (the
        first is the engine's) and lowers the limits to its own; then what the trackers no longer follow
        is forgotten (``prune``)."""
        self.pending[request_id] = pending
        tracker = pending.tracker
        if id(tracker) not in self.trackers:
            self.trackers[id(tracker)] = tracker
            if self.engine_tracker is None:
                self.engine_tracker = tracker
            self._max_age_s = min(self._max_age_s, float(getattr(tracker, "max_age_s", DEFAULT_MAX_AGE_S)))
            self._max_pending = min(
                self._max_pending, int(getattr(tracker, "max_in_flight", DEFAULT_MAX_IN_FLIGHT))
            )
        self.prune()

    def open(self, request_id: str, queued_ts: float | None) -> None:
        """The pending request was queued at ``queued_ts`` (None: at its arrival): its tracker hears of it
        (under its ``llm.choices`` span for a choice of ``n > 1``), and it is live from now on."""
        pending = self.pending.pop(request_id)
        ts = queued_ts if queued_ts is not None else pending.arrival
        arrival = pending.arrival
        if arrival is not None and ts is not None and arrival > ts:
            arrival = ts  # wall-to-monotonic conversion jitter must not put arrival after queued
        identity = pending.identity
        attributes: dict[str, Any] = {sc.LLM_REQUEST_ID: identity.client_id, sc.VLLM_REQUEST_ID: request_id}
        if identity.choice is not None:
            attributes[sc.LLM_CHOICE_INDEX] = identity.choice
        token = otel_context.attach(pending.choices.context) if pending.choices is not None else None
        try:
            pending.tracker.queued(
                request_id,
                ts=ts,
                arrival_ts=arrival,
                prompt_tokens=pending.prompt_tokens,
                carrier=pending.carrier,
                attributes=attributes,
            )
        finally:
            if token is not None:
                otel_context.detach(token)
        self.live[request_id] = pending.tracker

    def replay(self, request_id: str, events: Iterable[Any], cached: int | None = None) -> None:
        """A followed request's engine-core events (QUEUED, SCHEDULED, PREEMPTED; monotonic seconds) to
        its tracker, in timestamp order: the first opens a pending request."""
        # Sorted by timestamp (stable for ties): one output may hold QUEUED, SCHEDULED, PREEMPTED and
        # the next SCHEDULED of a request that was preempted before it produced anything. ``cached``:
        # the prefix-cache hits of the request's first scheduling, when this output carries them; a
        # later SCHEDULED (a rescheduling) gets what the in-process scheduler found cached then, if known.
        pending, evicted = self.pending, self.evicted
        for event in sorted(events, key=event_time):
            kind = getattr(event.type, "name", None)
            ts = event.timestamp
            if kind == "QUEUED":
                if request_id in pending:
                    self.open(request_id, ts)
                # A later QUEUED (a streaming-input session's next chunk) changes nothing for us.
                continue
            if request_id in pending:
                self.open(request_id, ts)  # QUEUED lost: the first event we see stands in for it
            if kind == "SCHEDULED":
                if request_id in evicted:
                    evicted.discard(request_id)
                    if cached is None and self._reschedulings is not None:
                        cached = self._reschedulings.take_rescheduling(request_id, ts)
                self.schedule(request_id, ts, cached)
                cached = None  # the first scheduling's figure is that SCHEDULED event's alone
            elif kind == "PREEMPTED":
                self.live[request_id].preempted([request_id], ts=ts)
                evicted.add(request_id)

    def schedule(self, request_id: str, ts: float, cached: int | None) -> None:
        """SCHEDULED, with the tokens found in the prefix cache when known: the prompt's at the first
        scheduling, the context's at a rescheduling (the tracker derives what was recomputed)."""
        if cached is None:
            self.live[request_id].scheduled([request_id], ts=ts)
        else:
            self.live[request_id].scheduled([request_id], ts=ts, cached_tokens=[cached])

    def finish(self, request_id: str, reason: str, ts: float, error: str | None) -> None:
        """The live request finished at ``ts`` with ``reason`` (and ``error``, a message, or None)."""
        tracker = self.live.pop(request_id)
        self.evicted.discard(request_id)
        if self._reschedulings is not None:
            self._reschedulings.forget(request_id)
        if self.handoffs.remote_decode:
            self.handoffs.forget(request_id)
        tracker.finished(request_id, reason=reason, ts=ts, error=error)
        self.choices.child_gone(request_id, ts)

    def sent(self, request_id: str, ts: float) -> None:
        """The live request's prefill part was handed off at ``ts``: it ends here as sent (``handoffs``)."""
        self.handoffs.sent(request_id, self.live.pop(request_id), ts)

    def abandon(self, still_open: Container[str], pending_events: PendingEvents | None = None) -> None:
        """After an abort: every request followed that left ``still_open`` finishes with ``abort``, its
        events not delivered yet (``pending_events``) replayed first."""
        now = time.monotonic()
        gone = [rid for rid in (*self.pending, *self.live) if rid not in still_open]
        for request_id in gone:
            events = pending_events(request_id) if pending_events is not None else None
            if events:
                self.replay(request_id, events)
            if request_id in self.pending:
                self.open(request_id, None)  # aborted before the engine reported anything: all queue time
            self.finish(request_id, sc.REASON_ABORT, now, None)

    def abandon_all(self, why: str) -> int:
        """Every request followed ends now as ``abandoned``, with ``why`` as its error. Returns how many
        live ones ended (pending ones are forgotten: their trackers never heard of them)."""
        now = time.monotonic()
        ended = 0
        for request_id in list(self.live):
            tracker = self.live.pop(request_id)
            try:
                tracker.finished(request_id, reason=sc.REASON_ABANDONED, ts=now, error=why)
                ended += 1
            finally:
                self.choices.child_gone(request_id, now)
        for request_id in list(self.pending):
            del self.pending[request_id]
            self.choices.child_gone(request_id, now)
        self.evicted.clear()
        self.handoffs.clear()
        return ended

    def prune(self) -> None:
        """Forget what the trackers no longer follow: requests they evicted, and registrations whose
        QUEUED never came within the trackers' maximum age (or beyond their maximum in flight)."""
        now = time.monotonic()
        horizon = now - self._max_age_s
        pending = self.pending
        while pending:
            oldest = next(iter(pending))
            if pending[oldest].added >= horizon and len(pending) <= self._max_pending:
                break
            del pending[oldest]
            self.handoffs.remote_decode.discard(oldest)
            self.choices.child_gone(oldest, now)
        self._added += 1
        in_flight = sum(getattr(t, "in_flight", 0) for t in self.trackers.values())
        # More live here than the trackers hold: they evicted some. A tracker shared with other sources
        # may hold more than this adapter follows, so look through the whole map now and then as well.
        if len(self.live) > in_flight or self._added % 4096 == 0:
            gone = [rid for rid, tracker in self.live.items() if rid not in tracker]
            for rid in gone:
                del self.live[rid]
                self.evicted.discard(rid)
                self.handoffs.forget(rid)
                self.choices.child_gone(rid, now)
