"""The hook side's tracker: the five-call hook an engine's scheduler loop calls, on its in-flight registry.

The hot path only records numbers: one timestamp per call shared by the whole batch, then per request a
dict lookup and a few attribute writes. When a request finishes, its timeline becomes one plain record
(``otel_llm.record.RequestRecord``, made by ``otel_llm.hooks.produce``) handed to the tracker's
``RecordConsumer``, which builds spans and metric values from it, in this process or in an export
process (``otel_llm.tracker`` chooses; nothing here knows which). Inter-token latency gaps and tokens per
step go to the per-step recorders the consumer gave (``use_recorders``): requests that also produced
tokens in the previous step share one gap, so a decode batch adds one sample per step, not one per
request. The per-step batch paths are here; the registry and each request's own events are
``otel_llm.hooks.inflight``, the argument checks ``otel_llm.hooks.checks``, ``engine_state()`` is
``otel_llm.hooks.engine_state``.

Threads: every hook takes one lock for its in-memory bookkeeping (never across export or span building),
so an API thread may call ``queued``/``finished`` while the engine thread calls the batch hooks.
Clock: ``time.monotonic()`` seconds everywhere; see docs/lifecycle.md for every rule.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from opentelemetry import trace

from otel_llm import semconv as sc
from otel_llm._version import __version__
from otel_llm.hooks import anomalies as an
from otel_llm.hooks import attributes as user_attrs
from otel_llm.hooks import checks
from otel_llm.hooks import stalls as stall_finder
from otel_llm.hooks.batches import BatchLog, check_scheduled
from otel_llm.hooks.checks import check_counts, check_ids
from otel_llm.hooks.clock import Clock
from otel_llm.hooks.engine_state import COUNTERS, EngineState, EngineStateHook
from otel_llm.hooks.engine_time import EngineTime, engine_time
from otel_llm.hooks.handoff import carrier_for, continue_request, read_carrier
from otel_llm.hooks.identity import TraceIdentity, parent_context, parent_span_context
from otel_llm.hooks.inflight import NO_STEP, InFlight
from otel_llm.hooks.options import TrackerOptions
from otel_llm.hooks.produce import record_of
from otel_llm.hooks.step_windows import StepWindows, plain
from otel_llm.hooks.steps import StepLog, rows
from otel_llm.hooks.timeline import PREEMPTED, RUNNING, FinishedRequest, Preemption, Step, Timeline
from otel_llm.record import (
    DETAIL_STEPS,
    MAX_PREEMPTION_SPANS,
    Figures,
    RecordConsumer,
    Stalls,
    StepRecorder,
    StepWindow,
    TrackerInfo,
    start_attributes,
)

_log = logging.getLogger("otel_llm")


class Samples:
    """Per-step samples kept for a consumer that collects them with ``figures(drain=True)``: (value, n)
    pairs, added with the tracker's lock held."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: list[tuple[float, int]] = []

    def add(self, value: float, n: int = 1) -> None:
        self.values.append((value, n))


class Tracker(InFlight, EngineStateHook):
    """Turns engine events into one record per request for ``consumer`` (the public ``RequestTracker``
    builds one; see there for every option).

    ``tracer_provider``: the provider whose id generator draws each request's trace and span ids at
    ``queued`` and whose sampler decides when a decision is needed before the request ends (the global
    one if None). ``consumer``: what finished requests are handed to, bound here before any request."""

    def __init__(
        self,
        options: TrackerOptions,
        tracer_provider: trace.TracerProvider | None,
        consumer: RecordConsumer,
    ) -> None:
        super().__init__(options.max_in_flight, options.max_age_s)  # the registry, with its lock
        self.role = options.role
        self.model = options.model
        self.trace_detail = detail = options.trace_detail
        self._base = base = options.base
        self._tracer_provider = tracer_provider
        self.clock = Clock()  # monotonic -> wall-clock, for every time this tracker and its engine export
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self.identity = TraceIdentity(provider.get_tracer("otel_llm", __version__))
        self.info = TrackerInfo(base, detail, options.role, self.clock.offset_ns)
        # The last engine steps, for llm.engine.step spans, and the engine's own step spans in windows
        # (detail "steps" only: one append per step, and the window's bookkeeping).
        self._step_log: StepLog | None = None
        if detail == DETAIL_STEPS:
            identity = self.identity
            self._step_log = StepLog(
                windows=StepWindows(lambda: identity.new_ids(None), identity.new_span_id)
            )
        # What each step computed, per request: made by the first batch() call (an engine that never
        # calls it pays one None check per tokens() call).
        self._batch_log: BatchLog | None = None
        self._engine_state = EngineState()
        # Where the hot path adds inter-token gaps and tokens per step: the consumer's recorders, or
        # these buffers until figures(drain=True) takes them (use_recorders).
        self._itl_samples, self._step_samples = Samples(), Samples()
        self._itl: StepRecorder = self._itl_samples
        self._step_tokens: StepRecorder = self._step_samples
        self._consumer = consumer
        consumer.bind(self)

    def telemetry_off(self) -> None:
        """Telemetry is off for good (no-op providers): no span or metric can ever show what the batch
        hooks record, so they only check their arguments; queued/finished/traceparent still work
        (propagation)."""
        self.scheduled = self.preempted = checks.batch_off  # type: ignore[method-assign]
        self.batch = checks.batch_composition_off  # type: ignore[method-assign]
        self.tokens = checks.tokens_off  # type: ignore[method-assign]

    # --- the hook -------------------------------------------------------------------------------

    def queued(
        self,
        request_id: Any,
        *,
        ts: float | None = None,
        arrival_ts: float | None = None,
        prompt_tokens: int | None = None,
        carrier: Mapping[str, Any] | None = None,
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        """The request entered the waiting queue (Q = ``ts``). ``arrival_ts`` (A) may be earlier, e.g.
        when the HTTP request arrived; ``carrier`` holds W3C ``traceparent``/``tracestate`` headers.

        On a ``role="decode"`` tracker, a carrier made by a prefill instance's ``handoff_carrier()``
        continues that request: same trace, same ``llm.request`` span (emitted here), arrival from it."""
        checks.check_queued(prompt_tokens, attributes)
        ts = self._timestamp(ts)
        arrival = ts if arrival_ts is None else self._timestamp(arrival_ts)
        handed = (
            read_carrier(carrier, self.clock) if self.role == sc.ROLE_DECODE and carrier is not None else None
        )
        if handed is not None:
            parent, trace_id, span_id = handed.parent, handed.trace_id, handed.span_id
            arrival = arrival if handed.arrival is None else handed.arrival
        else:
            parent, _remote = parent_context(carrier)
            trace_id, span_id = self.identity.new_ids(parent_span_context(parent))
        user_attributes, problems = user_attrs.clean(attributes) if attributes else (None, ())
        tl = Timeline(request_id, ts, arrival, prompt_tokens, trace_id, span_id, parent, user_attributes)
        if handed is not None:
            continue_request(tl, handed, self.identity)
        self._add(tl, problems)

    def scheduled(
        self, request_ids: Sequence[Any], ts: float | None = None, cached_tokens: Sequence[int] | None = None
    ) -> None:
        """These requests entered the running batch: the first time (S1) or after a preemption (R_k).

        ``cached_tokens``: per request, the tokens found in the engine's prefix cache (not computed).
        At the first scheduling: prompt tokens, kept as ``gen_ai.usage.cache_read.input_tokens`` on
        ``llm.request``. At a rescheduling: tokens of its context (prompt + output so far); the rest is
        what the engine recomputes (``llm.recompute.tokens``, see ``otel_llm.recompute``)."""
        check_ids(request_ids)
        if cached_tokens is not None:
            self._scheduled_cached(request_ids, ts, cached_tokens)
            return
        ts = self._timestamp(ts)
        with self._lock:
            get = self._inflight.get
            for rid in request_ids:
                tl = get(rid)
                if tl is None:
                    self._anomalies.note(an.UNKNOWN_REQUEST, rid)
                elif tl.state == RUNNING:
                    self._anomalies.note(an.SCHEDULED_WHILE_RUNNING, rid)
                else:
                    self._schedule(tl, self._clamp(tl, ts))
        if self._anomalies.unlogged:
            self._anomalies.log_pending()

    def tokens(
        self, request_ids: Sequence[Any], ts: float | None = None, counts: Sequence[int] | None = None
    ) -> None:
        """One engine step produced output tokens for these requests (1 each, or ``counts``). No ids: a
        step that produced no token (a prompt chunk) ended at ``ts``; only the ``batch()`` log hears of it
        (its time ends there, not at the next step's start)."""
        check_ids(request_ids)
        if request_ids.__class__ is not list and request_ids.__class__ is not tuple:
            request_ids = list(request_ids)  # counted below with len()
        ts = self._timestamp(ts)
        if not request_ids:
            if self._batch_log is not None:
                with self._lock:
                    self._batch_log.ended(ts)
            return
        with self._lock:
            prev = self._prev_step
            if counts is None and request_ids == self._batch and ts >= prev.ts:
                # The same batch as the previous step, each of its requests still on that step and no
                # other request on it: moving the shared Step forward gives every one of them its token
                # (count and latest token are derived from it), so a steady batch costs the same at any size.
                gap = ts - prev.ts
                prev.ts = ts
                prev.index += 1
                if self._step_log is not None:
                    self._step_log.add(
                        ts, prev.index, len(request_ids), request_ids, self._inflight.get, self._batch_log
                    )
                if self._batch_log is not None:
                    self._batch_log.ended(ts)
                if request_ids:
                    self._itl.add(gap, len(request_ids))
                return
            if ts < prev.ts:
                prev = NO_STEP  # a step out of order: every request takes the checked path
            step = self._prev_step = Step(ts, self._prev_step.index + 1)
            if self._step_log is not None:
                self._step_log.add(
                    ts, step.index, len(request_ids), request_ids, self._inflight.get, self._batch_log
                )
            if self._batch_log is not None:
                self._batch_log.ended(ts)
            get = self._inflight.get
            # Requests whose previous token came in the previous step share one gap; only the others are
            # counted, so the common case costs a lookup, an identity check and one write per request.
            checked = apart = 0  # apart: requests not left on the shared step (see _tokens_checked)
            if counts is None:
                for rid in request_ids:
                    tl = get(rid)
                    if tl is not None and tl.step is prev:
                        tl.step = step
                    else:
                        checked += 1
                        apart += self._tokens_checked(rid, tl, step, 1)
            else:
                check_counts(counts, len(request_ids))
                for rid, n in zip(request_ids, counts):
                    tl = get(rid)
                    if tl is not None and tl.step is prev and n.__class__ is int and n > 0:
                        tl.step = step
                        tl.token_base += n - 1  # moving to the next step counts one
                    else:
                        checked += 1
                        apart += self._tokens_checked(rid, tl, step, n)
            shared = len(request_ids) - checked
            if shared:
                self._itl.add(ts - prev.ts, shared)
            if apart:
                self._batch = None
            else:  # a copy of a list: an engine may reuse and change its list in place between steps
                self._batch = request_ids.copy() if request_ids.__class__ is list else request_ids
        if self._anomalies.unlogged:
            self._anomalies.log_pending()

    def batch(
        self,
        scheduled: Mapping[Any, int],
        ts: float | None = None,
        recompute: Collection[Any] | None = None,
    ) -> None:
        """Optional: what this engine step computes, per request (request id -> tokens: a prefill chunk,
        a recompute, one decode token, or several with speculative decoding), e.g. vLLM's
        ``SchedulerOutput.num_scheduled_tokens``. Call it once per step, when the step begins (``ts``),
        after that step's ``scheduled()`` / ``preempted()`` and before its ``tokens()``. With it the
        tracker explains each request's stalls (docs/lifecycle.md, "Stalls"); the tracker keeps no
        reference to ``scheduled``.

        The tracker tells a request's kind of work from its own timeline. ``recompute``: the requests of
        ``scheduled`` whose tokens are a recompute, for an engine whose ``preempted()`` / ``scheduled()``
        reach the tracker after the step (vLLM's frontend hears of a preemption with the next token);
        the tracker would count them as prefill or speculative tokens."""
        requests, total = check_scheduled(scheduled)
        ts = self._timestamp(ts)
        with self._lock:
            log = self._batch_log
            if log is None:
                log = self._batch_log = BatchLog()
            log.add(ts, scheduled, requests, total, self._states[RUNNING], self._inflight.get, recompute)

    def preempted(self, request_ids: Sequence[Any], ts: float | None = None) -> None:
        """The KV cache of these running requests was evicted (P_k); they wait to be recomputed."""
        check_ids(request_ids)
        ts = self._timestamp(ts)
        with self._lock:
            get = self._inflight.get
            for rid in request_ids:
                tl = get(rid)
                if tl is None:
                    self._anomalies.note(an.UNKNOWN_REQUEST, rid)
                    continue
                if tl.state != RUNNING:
                    self._anomalies.note(an.PREEMPTED_WHILE_NOT_RUNNING, rid)
                    continue
                at = self._clamp(tl, ts)
                tl.preemptions.append(Preemption(at, tl.output_tokens, tl.latest_token()))
                if len(tl.preemptions) == MAX_PREEMPTION_SPANS + 1:  # once per request, past the cap
                    self._anomalies.note(an.PREEMPTION_SPANS_CAPPED, rid)
                tl.token_base = tl.output_tokens
                tl.step = None
                self._batch = None
                tl.last_event = at
                tl.state = PREEMPTED
                self._states[RUNNING] -= 1
                self._states[PREEMPTED] += 1
        if self._anomalies.unlogged:
            self._anomalies.log_pending()

    def finished(
        self,
        request_id: Any,
        *,
        reason: str = sc.REASON_STOP,
        ts: float | None = None,
        error: BaseException | str | None = None,
    ) -> None:
        """The request left the engine (E). ``reason``: stop, length, abort, error, or another string."""
        checks.check_reason(reason)
        self._close(request_id, self._timestamp(ts), reason, error)

    def kv_sent(self, request_id: Any, *, ts: float | None = None, num_bytes: int | None = None) -> None:
        """Prefill instance: the request's KV cache was sent to a decode instance (K = ``ts``), which
        finishes the request; here it ends (its spans and this instance's values are recorded now).
        ``num_bytes``: the KV cache's size, when known."""
        checks.check_bytes(num_bytes)
        self._hand_off(request_id, self._timestamp(ts), num_bytes)

    def kv_received(self, request_id: Any, *, ts: float | None = None, num_bytes: int | None = None) -> None:
        """Decode instance: the request's KV cache, sent by the prefill instance, is in this instance
        (K = ``ts``, after ``queued``); the request now waits to be scheduled. ``num_bytes`` when known."""
        checks.check_bytes(num_bytes)
        self._kv_received(request_id, self._timestamp(ts), num_bytes)

    def handoff_carrier(self, request_id: Any) -> dict[str, str] | None:
        """What a prefill instance sends with the request's KV cache so that the decode instance's
        tracker continues its trace (``queued(carrier=...)`` there): string keys and values, to put in
        the transfer's metadata. None for an unknown request. See ``otel_llm.hooks.handoff``."""
        traceparent = self.traceparent(request_id)
        with self._lock:
            tl = self._inflight.get(request_id)
        if traceparent is None or tl is None:
            return None
        # What kv_sent() will decide (tail sampling): asked of the consumer with the record so far.
        fin = FinishedRequest(tl, tl.last_event, sc.REASON_HANDED_OFF, None, handed_off=True)
        try:
            kept = self._consumer.would_keep(record_of(fin, self.identity))
        except Exception:
            _log.debug("otel_llm: the tail-sampling decision of a hand-off failed", exc_info=True)
            kept = True
        return carrier_for(tl, traceparent, kept, self.clock)

    def traceparent(self, request_id: Any) -> str | None:
        """The W3C ``traceparent`` header value of the request's ``llm.request`` span (None if unknown)."""
        with self._lock:
            tl = self._inflight.get(request_id)
        if tl is None:
            return None
        try:
            attributes = start_attributes(str(tl.request_id), tl.attributes, tl.prompt_tokens, self._base)
            return self.identity.traceparent(tl, attributes)
        except Exception:  # a broken third-party sampler must not take the API thread down
            _log.warning("otel_llm: could not compute a traceparent", exc_info=True)
            return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Close requests past their maximum age, then have the consumer export what is pending (and
        flush the providers it exports through)."""
        self._close_overdue()
        try:
            return bool(self._consumer.flush(timeout_millis))
        except Exception:  # telemetry trouble never reaches the engine
            _log.warning("otel_llm: flushing telemetry failed", exc_info=True)
            return False

    @property
    def tracer_provider(self) -> trace.TracerProvider | None:
        """The tracer provider given at construction (None: the global one)."""
        return self._tracer_provider

    # --- what the consumer may ask (otel_llm.record.Producer) -----------------------------------------

    @property
    def lock(self) -> threading.Lock:
        """The registry's lock, held while the hot path adds to the per-step recorders."""
        return self._lock

    def use_recorders(self, itl: StepRecorder | None, step_tokens: StepRecorder | None) -> None:
        """Where inter-token gaps and tokens per step go from now on (None: buffered for
        ``figures(drain=True)``). Caller holds ``lock``."""
        self._itl = self._itl_samples if itl is None else itl
        self._step_tokens = self._step_samples if step_tokens is None else step_tokens

    def figures(self, drain: bool = False) -> Figures:
        """The tracker's running figures (``otel_llm.record.Figures``), read under its lock; the buffered
        per-step samples are handed over (and forgotten) with ``drain``, copied without."""
        state = self._engine_state
        with self._lock:
            if drain:
                itl, self._itl_samples.values = self._itl_samples.values, []
                step_pairs, self._step_samples.values = self._step_samples.values, []
            else:  # a look at what is buffered, left for the consumer that drains it
                itl, step_pairs = list(self._itl_samples.values), list(self._step_samples.values)
            step = [int(v) for v, _ in step_pairs]
            return Figures(
                (self._states[0], self._states[1], self._states[2]),
                dict(self._anomalies.counts),
                self._abandoned,
                state.kv_cache_usage,
                state.running,
                state.waiting,
                {arg: state.totals[arg] for arg in COUNTERS},
                dict(state.prompt_tokens) if state.prompt_tokens is not None else None,
                itl,
                step,
            )

    def note(self, kind: str, request_id: Any) -> None:
        """Trouble the consumer met with a request's record, counted as one of this tracker's anomalies."""
        self._note(kind, request_id)

    def step_windows(self, final: bool = False) -> list[StepWindow]:
        """The closed windows of the engine's own step spans (detail ``steps``), and the open one too
        when ``final``; an empty list at once when there is nothing to take."""
        log = self._step_log
        if log is None or log.windows is None:
            return []
        windows = log.windows
        if not (windows.closed or (final and windows.open is not None)):
            return []
        with self._lock:
            taken = windows.take(final)
        return [plain(w) for w in taken]

    def _renew_lock(self) -> None:
        """In a forked child: a fresh lock, and the consumer told (it shares the lock for the per-step
        recorders)."""
        super()._renew_lock()
        self._consumer.after_fork()

    # --- handing finished requests on -----------------------------------------------------------------

    def _stalls(self, fin: FinishedRequest, batches: BatchLog) -> Stalls:
        """The request's stalls, under the lock (the engine thread appends while requests finish
        elsewhere): from the log itself, at a cost per stall; for a request that a step left out, from a
        copy of the log's steps between its first and last token."""
        first, last = fin.timeline.first_token, fin.last_token
        if first is None or last is None:
            return (), ()
        with self._lock:
            found = stall_finder.find_logged(fin, batches)
            if found is not None:
                return found
            steps, ends, partial = batches.between(first, last)
            log_start = batches.oldest_start()
        return stall_finder.find(fin, steps, ends, partial, log_start)

    def _engine_time(self, fin: FinishedRequest, batches: BatchLog) -> EngineTime | None:
        """The request's share of the engine's steps, under the lock (the engine thread appends)."""
        with self._lock:
            return engine_time(fin, batches)

    def _finish(self, fin: FinishedRequest) -> None:
        """The finished request's record, to the consumer; never raises into the engine."""
        try:
            steps = stalls = cost = None
            log, batches = self._step_log, self._batch_log
            if log is not None:
                with self._lock:
                    recent = log.since(fin.timeline.first_scheduled)
                steps = rows(fin, recent)
            if batches is not None:
                stalls = self._stalls(fin, batches)
                cost = self._engine_time(fin, batches)
            record = record_of(fin, self.identity, steps, stalls, cost)
        except Exception:
            self._note(an.FINISH_FAILED, fin.timeline.request_id)
            _log.debug("otel_llm: the record of request %r failed", fin.timeline.request_id, exc_info=True)
            return
        try:
            self._consumer.request(record)
        except Exception:
            self._note(an.FINISH_FAILED, fin.timeline.request_id)
            _log.debug("otel_llm: handing on request %r failed", fin.timeline.request_id, exc_info=True)
