"""Counting what an engine reports that does not fit the lifecycle (docs/lifecycle.md, "Odd input").

Hooks never raise for these: each kind is counted (exported as the ``otel_llm.anomalies`` self-metric)
and logged once per tracker, so a misbehaving engine is visible without flooding its logs. The log call
happens after the tracker released its lock (a logging handler may do I/O; the engine must not wait on it
while holding the lock another thread needs).
"""

from __future__ import annotations

import contextlib
import logging

from otel_llm.record import ANOMALY_FINISH_FAILED, ANOMALY_SPAN_HOOK_FAILED

_log = logging.getLogger("otel_llm")

UNKNOWN_REQUEST = "unknown_request"  # an event for a request never queued, or already finished
DUPLICATE_QUEUED = "duplicate_queued"
TOKENS_BEFORE_SCHEDULED = "tokens_before_scheduled"  # treated as scheduled at that instant
SCHEDULED_WHILE_RUNNING = "scheduled_while_running"  # ignored
PREEMPTED_WHILE_NOT_RUNNING = "preempted_while_not_running"  # ignored
TIMESTAMP_REGRESSION = "timestamp_regression"  # earlier than the request's previous event: clamped
BAD_TIMESTAMP = "bad_timestamp"  # NaN or infinite: replaced by now
ARRIVAL_AFTER_QUEUED = "arrival_after_queued"  # clamped to queued
BAD_TOKEN_COUNT = "bad_token_count"  # zero, negative or not an int in tokens(counts=...): event skipped
# Building a request's record, spans or metrics raised: logged, the engine goes on.
FINISH_FAILED = ANOMALY_FINISH_FAILED
SPAN_HOOK_FAILED = ANOMALY_SPAN_HOOK_FAILED  # the user's span_hook raised: logged once, span still exported
ATTRIBUTE_DROPPED = "attribute_dropped"  # see otel_llm.attributes
ATTRIBUTE_TRUNCATED = "attribute_truncated"
# More preemptions than the tracker draws spans for: the rest are summarised on llm.request.
PREEMPTION_SPANS_CAPPED = "preemption_spans_capped"
# scheduled(cached_tokens=) at a rescheduling gave more tokens than the request's prompt + output so far:
# the recompute is taken as 0 tokens (otel_llm.recompute).
CACHED_OVER_CONTEXT = "cached_tokens_over_context"

KINDS = (
    UNKNOWN_REQUEST,
    DUPLICATE_QUEUED,
    TOKENS_BEFORE_SCHEDULED,
    SCHEDULED_WHILE_RUNNING,
    PREEMPTED_WHILE_NOT_RUNNING,
    TIMESTAMP_REGRESSION,
    BAD_TIMESTAMP,
    ARRIVAL_AFTER_QUEUED,
    BAD_TOKEN_COUNT,
    FINISH_FAILED,
    SPAN_HOOK_FAILED,
    ATTRIBUTE_DROPPED,
    ATTRIBUTE_TRUNCATED,
    PREEMPTION_SPANS_CAPPED,
    CACHED_OVER_CONTEXT,
)


class AnomalyCounter:
    """Counts by kind. ``note`` is called with the tracker's lock held; it is cheap and never raises.

    The first anomaly of each kind waits in ``unlogged`` until ``log_pending`` runs, which the tracker
    calls once its lock is released.
    """

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.unlogged: list[tuple[str, object]] = []

    def note(self, kind: str, request_id: object = None) -> None:
        count = self.counts.get(kind, 0)
        self.counts[kind] = count + 1
        if count == 0:
            self.unlogged.append((kind, request_id))

    def log_pending(self) -> None:
        """Log the anomalies noted first of their kind since the last call. Call without any lock held."""
        unlogged = self.unlogged
        while unlogged:
            try:
                kind, request_id = unlogged.pop(0)  # list.pop is atomic: two callers never log one twice
            except IndexError:
                return
            with contextlib.suppress(Exception):  # a broken logging handler must not reach the engine
                _log.warning(
                    "otel_llm: %s (request %r); further ones are only counted in %s",
                    kind,
                    request_id,
                    "otel_llm.anomalies",
                )
