"""Counting what an engine reports that does not fit the lifecycle (lifecycle.md, "odd input").

Hooks never raise for these: each kind is counted (exported as the ``otel_llm.anomalies`` self-metric)
and logged once per tracker, so a misbehaving engine is visible without flooding its logs.
"""

from __future__ import annotations

import logging

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
FINISH_FAILED = "finish_failed"  # building spans or metrics raised: logged, the engine goes on
SPAN_HOOK_FAILED = "span_hook_failed"  # the user's span_hook raised: logged once, span still exported
ATTRIBUTE_DROPPED = "attribute_dropped"  # see otel_llm.attributes
ATTRIBUTE_TRUNCATED = "attribute_truncated"

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
)


class AnomalyCounter:
    """Counts by kind. ``note`` is called with the tracker's lock held; it is cheap and never raises."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def note(self, kind: str, request_id: object = None) -> None:
        count = self.counts.get(kind, 0)
        self.counts[kind] = count + 1
        if count == 0:
            _log.warning(
                "otel_llm: %s (request %r); further ones are only counted in %s",
                kind,
                request_id,
                "otel_llm.anomalies",
            )
