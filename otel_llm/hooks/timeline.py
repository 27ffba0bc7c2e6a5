"""One request's recorded events: plain numbers, no OpenTelemetry.

All timestamps are ``time.monotonic()`` seconds (floats). A Timeline is written only by the tracker's
hooks while the request is in flight and read once by the span and metric builders after it finished.
Names follow docs/lifecycle.md: A arrival, Q queued, S1 first scheduled, F first tokens event, L last tokens
event, E finished; per preemption P_k (preempted), R_k (rescheduled), T_k (first tokens after R_k).
Disaggregated serving adds K, the end of the request's KV transfer on this instance: sent (the prefill
instance's hand-off, which ends the request there) or received (on the decode instance).
"""

from __future__ import annotations

from typing import Any

WAITING = 0
RUNNING = 1
PREEMPTED = 2


class Preemption:
    """One eviction of the request's KV cache and what followed it (monotonic seconds)."""

    __slots__ = (
        "after_first_token",
        "cached_tokens",
        "last_token",
        "output_tokens",
        "preempted",
        "recompute_tokens",
        "recomputed",
        "rescheduled",
    )

    def __init__(self, preempted: float, output_tokens: int, last_token: float | None) -> None:
        self.preempted = preempted  # P_k
        self.output_tokens = output_tokens  # tokens produced before P_k
        # The latest tokens event before P_k (L so far); the gap to the next token is measured from it.
        self.last_token = last_token
        # A preemption after the first token belongs to decode, one before it to prefill.
        self.after_first_token = last_token is not None
        self.rescheduled: float | None = None  # R_k, None while still evicted
        self.recomputed: float | None = None  # T_k, None until a token follows R_k
        # What the rescheduling at R_k cost in work, in tokens, when the engine reported its prefix-cache
        # hits then (``scheduled(cached_tokens=...)``; otel_llm.recompute): the tokens of the context it
        # found cached, and those it had to compute again. None when not reported.
        self.cached_tokens: int | None = None
        self.recompute_tokens: int | None = None


class Step:
    """One tokens() call: its timestamp (monotonic seconds) and its index in the tracker's sequence of calls.

    Requests that produce a token in consecutive steps only swap which Step they point at; their token
    count is derived from the index difference, so the per-request work of a step is one attribute write.
    When a call lists exactly the previous call's batch, the tracker moves that Step itself forward
    (``ts`` and ``index``) instead: every request on it gets its token at once.
    """

    __slots__ = ("index", "ts")

    def __init__(self, ts: float, index: int) -> None:
        self.ts = ts
        self.index = index


class Timeline:
    """The events of one in-flight request.

    ``step`` is the Step of the latest tokens event while the request runs uninterrupted (None before its
    first token and while preempted); ``last_token`` and ``output_tokens`` are derived from it and
    ``token_base``, so the tracker's fast path (``step is the previous Step``) only moves ``step``. A
    preemption settles the count into ``token_base`` and clears ``step``, so that fast path only ever
    matches a request that is still running.
    """

    __slots__ = (
        "arrival",
        "attributes",
        "cached_tokens",
        "first_scheduled",
        "first_token",
        "handed_in",
        "kv_bytes",
        "kv_done",
        "last_event",
        "parent",
        "preemptions",
        "prefill_kept",
        "prompt_tokens",
        "queued",
        "request_id",
        "sampling",
        "span_id",
        "state",
        "step",
        "token_base",
        "trace_id",
    )

    def __init__(
        self,
        request_id: Any,
        queued: float,
        arrival: float,
        prompt_tokens: int | None,
        trace_id: int,
        span_id: int,
        parent: Any,
        attributes: dict[str, Any] | None,
    ) -> None:
        self.request_id = request_id
        self.queued = queued  # Q
        self.arrival = arrival  # A (<= Q)
        self.prompt_tokens = prompt_tokens
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent = parent  # parent Context (remote or local), or None for a new trace
        self.attributes = attributes
        self.state = WAITING
        self.first_scheduled: float | None = None  # S1
        # Prompt tokens the engine found in its prefix cache when it first scheduled the request.
        self.cached_tokens: int | None = None
        self.first_token: float | None = None  # F
        self.step: Step | None = None  # latest tokens event of the current run, None while preempted
        self.last_event = queued  # for clamping out-of-order timestamps
        self.token_base = 0  # output tokens = token_base + step.index (+ 0 while step is None)
        self.preemptions: list[Preemption] = []
        self.kv_done: float | None = None  # K: KV transfer finished (sent or received) on this instance
        self.kv_bytes: int | None = None  # bytes of that transfer, when the engine knows them
        # True on a decode instance for a request a prefill instance handed over (its trace identity and
        # arrival came with the transfer, see otel_llm.hooks.handoff).
        self.handed_in = False
        # On a decode instance: whether the prefill instance kept the request's spans (tail sampling),
        # as carried with the transfer; None when not carried.
        self.prefill_kept: bool | None = None
        # The sampler's decision for the request span, taken once: by traceparent() or when the spans
        # are built, whichever comes first (otel_llm.spans).
        self.sampling: Any = None

    @property
    def last_token(self) -> float | None:
        """The latest tokens event of the current run (monotonic seconds); None while preempted."""
        step = self.step
        return None if step is None else step.ts

    @property
    def output_tokens(self) -> int:
        step = self.step
        return self.token_base if step is None else self.token_base + step.index

    def latest_token(self) -> float | None:
        """L so far: the latest tokens event, also while the request is preempted."""
        if self.last_token is not None:
            return self.last_token
        return self.preemptions[-1].last_token if self.preemptions else None


class FinishedRequest:
    """A timeline closed at E with its finish reason, handed to the span and metric builders."""

    __slots__ = ("error", "finished", "handed_off", "last_token", "reason", "timeline")

    def __init__(
        self,
        timeline: Timeline,
        finished: float,
        reason: str,
        error: BaseException | str | None,
        handed_off: bool = False,
    ):
        self.timeline = timeline
        self.finished = finished  # E (on a prefill instance that handed the request off: K, the hand-off)
        self.reason = reason
        self.error = error
        self.last_token = timeline.latest_token()  # L
        # The request left this (prefill) instance for a decode instance, which finishes it.
        self.handed_off = handed_off
