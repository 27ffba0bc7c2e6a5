"""RequestTracker: the five-call hook an engine's scheduler loop calls, on its in-flight registry.

The hot path only records numbers: one timestamp per call shared by the whole batch, then per request a
dict lookup and a few attribute writes. Spans and request-level metrics are built once, when a request
finishes (``otel_llm.finish``). Inter-token latency is counted here into a bucket histogram: requests
that also produced tokens in the previous step share one gap, so a decode batch adds to the histogram
once per step, not once per request. The per-step batch paths are here; the registry and each
request's own events are ``otel_llm.inflight``, the argument checks ``otel_llm.checks``,
``engine_state()`` is ``otel_llm.engine_state``.

Threads: every hook takes one lock for its in-memory bookkeeping (never across export or span building),
so an API thread may call ``queued``/``finished`` while the engine thread calls the batch hooks.
Clock: ``time.monotonic()`` seconds everywhere; see docs/lifecycle.md for every rule.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import metrics, trace

from otel_llm import anomalies as an
from otel_llm import attributes as user_attrs
from otel_llm import checks, self_metrics
from otel_llm import semconv as sc
from otel_llm.checks import check_counts, check_ids
from otel_llm.clock import Clock
from otel_llm.engine_state import EngineState, EngineStateHook
from otel_llm.finish import Finisher
from otel_llm.handoff import carrier_for, continue_request, read_carrier
from otel_llm.identity import parent_context, parent_span_context
from otel_llm.inflight import NO_STEP, InFlight
from otel_llm.metrics import RequestMetrics
from otel_llm.records import MAX_PREEMPTION_SPANS, start_attributes
from otel_llm.sampling import TailSampler, TailSampling
from otel_llm.spans import SpanBuilder
from otel_llm.steps import DETAIL_STEPS, StepLog
from otel_llm.timeline import PREEMPTED, RUNNING, Preemption, Step, Timeline
from otel_llm.tracker_options import (
    DEFAULT_MAX_AGE_S,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_OPERATION_NAME,
    DEFAULT_PROVIDER_NAME,
    SpanHook,
    resolve_options,
)

_log = logging.getLogger("otel_llm")


class RequestTracker(InFlight, EngineStateHook):
    """Turns engine events into one trace and the latency metrics per request.

    Args:
        tracer_provider / meter_provider: where spans and metrics go; the global providers if None.
        model: ``gen_ai.request.model`` on spans and metrics.
        provider_name / operation_name: ``gen_ai.provider.name`` / ``gen_ai.operation.name``.
        max_in_flight: requests kept at most; past it the oldest is closed with reason ``evicted``.
        max_age_s: a request in flight longer than this (monotonic seconds since queued) is evicted.
        span_hook: called as ``span_hook(span, finished_request)`` on each ``llm.request`` span before it
            ends (add attributes, events). An exception from it is logged once and counted; the span is
            still exported.
        tail_sampling: which finished requests keep their trace (``otel_llm.sampling``): a
            ``TailSampling``, False for every one, or None to read ``OTEL_LLM_TAIL_SAMPLING*`` (default:
            off, every trace kept). Metrics count every request either way.
        trace_detail: ``request``, ``phases`` or ``steps`` (``otel_llm.steps``); None reads
            ``OTEL_LLM_TRACE_DETAIL`` (default ``phases``).
        role: the engine instance's part in disaggregated serving: ``"prefill"`` (hands requests off
            with ``kv_sent``), ``"decode"`` (continues requests whose ``queued`` carrier is a prefill
            instance's ``handoff_carrier``), or ``"both"`` (the default: the whole request here). A
            role other than ``both`` is the ``llm.role`` attribute of every span and metric point.
        attributes: more attributes of every span and metric point, for what the integration knows of the
            server: ``server.address``, ``server.port``, ``gen_ai.response.model`` (the tracker's own
            attributes, e.g. ``gen_ai.request.model``, are not overridden).
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        model: str | None = None,
        provider_name: str = DEFAULT_PROVIDER_NAME,
        operation_name: str = DEFAULT_OPERATION_NAME,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        span_hook: SpanHook | None = None,
        tail_sampling: TailSampling | bool | None = None,
        trace_detail: str | None = None,
        role: str = sc.ROLE_BOTH,
        attributes: Mapping[str, str | int | float | bool] | None = None,
    ) -> None:
        options = resolve_options(
            model=model,
            provider_name=provider_name,
            operation_name=operation_name,
            max_in_flight=max_in_flight,
            max_age_s=max_age_s,
            span_hook=span_hook,
            tail_sampling=tail_sampling,
            trace_detail=trace_detail,
            role=role,
            attributes=attributes,
        )
        super().__init__(options.max_in_flight, options.max_age_s)  # the registry, with its lock
        self.role = options.role
        self.model = options.model
        self.trace_detail = detail = options.trace_detail
        self._base = base = options.base
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self.clock = Clock()  # monotonic -> wall-clock, for every time this tracker and its engine export
        self._spans = SpanBuilder(tracer_provider, base, self.clock, detail)
        # The last engine steps, for llm.engine.step spans (detail "steps" only: one append per step).
        self._step_log: StepLog | None = StepLog() if detail == DETAIL_STEPS else None
        self._metrics = RequestMetrics(meter_provider, base, self._lock)
        self._engine_state = EngineState(self._metrics)
        self._tail = None if options.tail_sampling is None else TailSampler(options.tail_sampling)
        self._finisher = Finisher(
            self._spans,
            self._metrics,
            self.clock,
            base,
            self._tail,
            self._step_log,
            options.span_hook,
            self._lock,
            self._note,
            self._adopt_itl,
        )
        self._finish = self._finisher.finish
        self._itl = self._metrics.itl  # inter-token latency: added to on the hot path, under self._lock
        self_metrics.register(self._metrics, self, self._tail)
        if isinstance(tracer_provider, trace.NoOpTracerProvider) and isinstance(
            meter_provider, metrics.NoOpMeterProvider
        ):
            # Telemetry is off for good: no span or metric can ever show what the batch hooks record, so
            # they only check their arguments; queued/finished/traceparent still work (propagation).
            self.scheduled = self.preempted = checks.batch_off  # type: ignore[method-assign]
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
            trace_id, span_id = self._spans.identity.new_ids(parent_span_context(parent))
        user_attributes, problems = user_attrs.clean(attributes) if attributes else (None, ())
        tl = Timeline(request_id, ts, arrival, prompt_tokens, trace_id, span_id, parent, user_attributes)
        if handed is not None:
            continue_request(tl, handed, self._spans.identity)
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
        """One engine step produced output tokens for these requests (1 each, or ``counts``)."""
        check_ids(request_ids)
        if request_ids.__class__ is not list and request_ids.__class__ is not tuple:
            request_ids = list(request_ids)  # counted below with len()
        ts = self._timestamp(ts)
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
                    self._step_log.add(ts, prev.index, len(request_ids))
                if request_ids:
                    self._itl.add(gap, len(request_ids))
                return
            if ts < prev.ts:
                prev = NO_STEP  # a step out of order: every request takes the checked path
            step = self._prev_step = Step(ts, self._prev_step.index + 1)
            if self._step_log is not None:
                self._step_log.add(ts, step.index, len(request_ids))
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
        the transfer's metadata. None for an unknown request. See ``otel_llm.handoff``."""
        traceparent = self.traceparent(request_id)
        with self._lock:
            tl = self._inflight.get(request_id)
        if traceparent is None or tl is None:
            return None
        return carrier_for(tl, traceparent, self._tail, self.clock)

    def traceparent(self, request_id: Any) -> str | None:
        """The W3C ``traceparent`` header value of the request's ``llm.request`` span (None if unknown)."""
        with self._lock:
            tl = self._inflight.get(request_id)
        if tl is None:
            return None
        try:
            return self._spans.identity.traceparent(tl, start_attributes(tl, self._base))
        except Exception:  # a broken third-party sampler must not take the API thread down
            _log.warning("otel_llm: could not compute a traceparent", exc_info=True)
            return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Close requests past their maximum age, then flush the tracer and meter providers."""
        self._close_overdue()
        self._metrics.resolve(self._adopt_itl)
        ok = True
        for provider in (
            self._tracer_provider or trace.get_tracer_provider(),
            self._meter_provider or metrics.get_meter_provider(),
        ):
            flush = getattr(provider, "force_flush", None)
            if flush is not None:
                ok = bool(flush(timeout_millis)) and ok
        return ok

    @property
    def tracer_provider(self) -> trace.TracerProvider | None:
        """The tracer provider given at construction (None: the global one)."""
        return self._tracer_provider

    def _renew_lock(self) -> None:
        """In a forked child: a fresh lock, shared again with the finishing pipeline and the metrics."""
        super()._renew_lock()
        self._finisher.lock = self._lock
        self._metrics.renew_lock(self._lock)
