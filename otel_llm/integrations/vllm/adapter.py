"""Turn vLLM V1 engine-core outputs into RequestTracker calls.

vLLM's engine core timestamps what happens to a request (QUEUED, SCHEDULED, PREEMPTED; monotonic seconds)
and sends the events to the frontend inside the request's next ``EngineCoreOutput``, so they arrive late:
QUEUED together with the first tokens, PREEMPTED together with the SCHEDULED that resumed the request.
Every event keeps its own timestamp, and the tracker takes explicit timestamps, so replaying one output's
events in timestamp order before its tokens rebuilds the timeline exactly as it happened. New tokens
carry the batch's ``EngineCoreOutputs.timestamp`` (the same clock). The result: our queue / prefill /
decode / inference values are computed from the very timestamps vLLM's ``FinishedRequestStats`` uses.

Nothing here imports vLLM: outputs and requests are read by attribute name, enum members by name, so a
vLLM build that renumbers its enums keeps working.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Container, Iterable, Mapping
from typing import Any

from otel_llm import semconv as sc

_log = logging.getLogger(__name__)

# vLLM's FinishReason member names -> our finish reasons; other members are kept, lower-cased
# (vLLM 0.33 also has REPETITION).
_FINISH_REASONS = {
    "STOP": sc.REASON_STOP,
    "LENGTH": sc.REASON_LENGTH,
    "ABORT": sc.REASON_ABORT,
    "ERROR": sc.REASON_ERROR,
}


def finish_reason_name(reason: Any) -> str:
    """Our finish reason for a vLLM ``FinishReason`` (an IntEnum whose STOP is 0, hence falsy)."""
    name = getattr(reason, "name", None)
    if not isinstance(name, str):
        return str(reason).lower()
    return _FINISH_REASONS.get(name, name.lower())


def wall_to_monotonic(wall_ts: float) -> float:
    """Convert a ``time.time()`` value (vLLM's ``arrival_time``) to the ``time.monotonic()`` clock."""
    return wall_ts - (time.time() - time.monotonic())


def prompt_length(request: Any) -> int | None:
    """Number of prompt tokens of an ``EngineCoreRequest`` (token ids or prompt embeddings)."""
    token_ids = getattr(request, "prompt_token_ids", None)
    if token_ids is not None:
        return len(token_ids)
    embeds = getattr(request, "prompt_embeds", None)
    shape = getattr(embeds, "shape", None)
    return int(shape[0]) if shape else None


class _Pending:
    """A request registered with the frontend whose QUEUED event has not arrived yet."""

    __slots__ = ("added", "arrival", "carrier", "prompt_tokens")

    def __init__(self, arrival: float | None, prompt_tokens: int | None, carrier: Mapping[str, str] | None):
        self.added = time.monotonic()  # when the frontend registered it (monotonic seconds)
        self.arrival = arrival  # monotonic seconds, or None when vLLM gave no arrival time
        self.prompt_tokens = prompt_tokens
        self.carrier = carrier


class VLLMAdapter:
    """Feeds the requests and outputs of one vLLM ``OutputProcessor`` into a RequestTracker.

    The tracker's request ids are vLLM's internal request ids (unique per sequence, also with ``n > 1``).
    Call order per engine step: ``outputs`` before vLLM processes the batch (it may trim tokens after a
    stop string), ``settle`` after (requests vLLM dropped from its open set have finished).
    """

    def __init__(self, tracker: Any) -> None:
        self._tracker = tracker
        self._pending: dict[str, _Pending] = {}  # insertion order: oldest first
        self._live: set[str] = set()  # queued with the tracker, not finished
        self._warned_no_events = False
        # The tracker closes requests that never finish (max_age_s, max_in_flight); these maps follow
        # it, so they stay bounded by the same limits.
        self._max_age_s = float(getattr(tracker, "max_age_s", 1800.0))
        self._max_pending = int(getattr(tracker, "max_in_flight", 65_536))
        self._added = 0

    def request_added(self, request: Any) -> None:
        """Remember a new ``EngineCoreRequest``; the tracker hears of it when its QUEUED event arrives."""
        request_id = request.request_id
        if request_id in self._pending or request_id in self._live:
            return  # a streaming-input update of a request we already follow
        arrival_wall = getattr(request, "arrival_time", None)
        arrival = wall_to_monotonic(arrival_wall) if arrival_wall else None
        headers = getattr(request, "trace_headers", None)
        carrier = dict(headers) if headers else None
        self._pending[request_id] = _Pending(arrival, prompt_length(request), carrier)
        self._prune()

    def outputs(self, outputs: Iterable[Any], batch_ts: float | None) -> None:
        """Replay one batch of ``EngineCoreOutput``s: each request's events, then the batch's tokens."""
        if batch_ts is None:
            batch_ts = time.monotonic()
        token_ids: list[str] = []
        counts: list[int] = []
        for out in outputs:
            request_id = out.request_id
            if request_id not in self._live and request_id not in self._pending:
                continue  # registered before instrumentation, or already finished
            events = out.events
            if events:
                self._replay(request_id, events)
            if request_id in self._pending:
                # No QUEUED event: the engine core runs without stats logging. Queue from arrival and
                # schedule at this batch; the prefill/queue split and preemptions are unknown then.
                self._note_no_events()
                self._open(request_id, None)
                self._tracker.scheduled([request_id], ts=batch_ts)
            produced = len(out.new_token_ids)
            if produced:
                token_ids.append(request_id)
                counts.append(produced)
        if token_ids:
            self._tracker.tokens(token_ids, ts=batch_ts, counts=counts)

    def settle(self, outputs: Iterable[Any], still_open: Container[str]) -> None:
        """After vLLM processed a batch: finish the requests of ``outputs`` that left ``still_open``.

        A request can finish in the frontend without an engine finish reason (a stop string found by the
        detokenizer, or a request rejected with an error), so membership decides, the reason explains.
        """
        now = time.monotonic()
        for out in outputs:
            request_id = out.request_id
            if request_id not in self._live or request_id in still_open:
                continue
            error = getattr(out, "error", None)
            if out.finish_reason is not None:
                reason = finish_reason_name(out.finish_reason)
            elif error is not None:
                reason = sc.REASON_ERROR
            else:
                reason = sc.REASON_STOP
            message = getattr(error, "message", None) if error is not None else None
            self._live.discard(request_id)
            self._tracker.finished(request_id, reason=reason, ts=now, error=message)

    def abandoned(self, still_open: Container[str]) -> None:
        """After an abort: every request we follow that left ``still_open`` finished with ``abort``."""
        now = time.monotonic()
        for request_id in [rid for rid in self._pending if rid not in still_open]:
            self._open(request_id, None)  # aborted before the engine reported anything: all queue time
        for request_id in [rid for rid in self._live if rid not in still_open]:
            self._live.discard(request_id)
            self._tracker.finished(request_id, reason=sc.REASON_ABORT, ts=now)

    # --- internals -----------------------------------------------------------------------------------

    def _prune(self) -> None:
        """Forget what the tracker no longer follows: requests it evicted, and registrations whose QUEUED
        never came within the tracker's maximum age (or beyond its maximum in flight)."""
        horizon = time.monotonic() - self._max_age_s
        pending = self._pending
        while pending:
            oldest = next(iter(pending))
            if pending[oldest].added >= horizon and len(pending) <= self._max_pending:
                break
            del pending[oldest]
        tracker = self._tracker
        self._added += 1
        in_flight = getattr(tracker, "in_flight", None)
        # More live here than the tracker holds: it evicted some. A tracker shared with other sources
        # may hold more than this adapter follows, so look through the whole set now and then as well.
        evicted = isinstance(in_flight, int) and len(self._live) > in_flight
        if evicted or self._added % 4096 == 0:
            self._live = {rid for rid in self._live if rid in tracker}

    def _replay(self, request_id: str, events: Iterable[Any]) -> None:
        # Sorted by timestamp (stable for ties): one output may hold QUEUED, SCHEDULED, PREEMPTED and
        # the next SCHEDULED of a request that was preempted before it produced anything.
        for event in sorted(events, key=_timestamp):
            kind = getattr(event.type, "name", None)
            ts = event.timestamp
            if kind == "QUEUED":
                if request_id in self._pending:
                    self._open(request_id, ts)
                # A later QUEUED (a streaming-input session's next chunk) changes nothing for us.
                continue
            if request_id in self._pending:
                self._open(request_id, ts)  # QUEUED lost: the first event we see stands in for it
            if kind == "SCHEDULED":
                self._tracker.scheduled([request_id], ts=ts)
            elif kind == "PREEMPTED":
                self._tracker.preempted([request_id], ts=ts)

    def _open(self, request_id: str, queued_ts: float | None) -> None:
        pending = self._pending.pop(request_id)
        ts = queued_ts if queued_ts is not None else pending.arrival
        arrival = pending.arrival
        if arrival is not None and ts is not None and arrival > ts:
            arrival = ts  # wall-to-monotonic conversion jitter must not put arrival after queued
        self._tracker.queued(
            request_id,
            ts=ts,
            arrival_ts=arrival,
            prompt_tokens=pending.prompt_tokens,
            carrier=pending.carrier,
        )
        self._live.add(request_id)

    def _note_no_events(self) -> None:
        if not self._warned_no_events:
            self._warned_no_events = True
            _log.info(
                "otel_llm: vLLM outputs carry no request events (engine stats logging is off); "
                "queue time and preemptions are not visible. Instrument the engine-core process too "
                "(the vllm.general_plugins entry point does) or leave stats logging on."
            )


def _timestamp(event: Any) -> float:
    return event.timestamp
