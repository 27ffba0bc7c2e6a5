"""RequestTracker: the five-call hook an engine's scheduler loop calls, and the in-flight registry.

The hot path only records numbers: one timestamp per call shared by the whole batch, then per request a
dict lookup and a few attribute writes. Spans and request-level metrics are built once, when a request
finishes (``otel_llm.spans``, ``otel_llm.metrics``). Inter-token latency is counted here into a bucket
histogram: requests that also produced tokens in the previous step share one gap, so a decode batch adds
to the histogram once per step, not once per request.

Threads: every hook takes one lock for its in-memory bookkeeping (never across export or span building),
so an API thread may call ``queued``/``finished`` while the engine thread calls the batch hooks.
Clock: ``time.monotonic()`` seconds everywhere; see docs/lifecycle.md for every rule.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Span

from otel_llm import anomalies as an
from otel_llm import attributes as user_attrs
from otel_llm import semconv as sc
from otel_llm.clock import Clock
from otel_llm.engine_state import EngineState, count
from otel_llm.finish import Finisher
from otel_llm.handoff import make_carrier, read_carrier
from otel_llm.identity import parent_context, parent_span_context
from otel_llm.intervals import Intervals
from otel_llm.metrics import RequestMetrics
from otel_llm.recompute import reschedule
from otel_llm.records import MAX_PREEMPTION_SPANS, start_attributes
from otel_llm.sampling import TailSampler, TailSampling
from otel_llm.spans import SpanBuilder
from otel_llm.steps import DETAIL_STEPS, StepLog, resolve_detail
from otel_llm.timeline import PREEMPTED, RUNNING, WAITING, FinishedRequest, Preemption, Step, Timeline

_log = logging.getLogger("otel_llm")
_monotonic = time.monotonic
_INF = math.inf

DEFAULT_PROVIDER_NAME = "otel_llm"
DEFAULT_OPERATION_NAME = "text_completion"
DEFAULT_MAX_IN_FLIGHT = 65_536
DEFAULT_MAX_AGE_S = 1800.0  # a request in flight for 30 minutes is leaked, not slow

SpanHook = Callable[[Span, FinishedRequest], None]

# A fork while another thread holds a tracker's lock would leave the child's copy locked forever; the
# child gets fresh locks (its copy of the registry is only ever touched by its own threads).
_LIVE_TRACKERS: weakref.WeakSet[RequestTracker] = weakref.WeakSet()


def _renew_locks_after_fork() -> None:
    for tracker in list(_LIVE_TRACKERS):
        tracker._lock = threading.Lock()
        tracker._finisher.lock = tracker._lock
        tracker._metrics.renew_lock(tracker._lock)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks_after_fork)

_NO_STEP = Step(-_INF, -1)  # "no previous tokens step": no request's step is this one, not even None


def _check_ids(request_ids: Any) -> None:
    if request_ids.__class__ is list or request_ids.__class__ is tuple:
        return  # the common case, without the cost of an ABC isinstance check
    if isinstance(request_ids, (str, bytes)) or not isinstance(request_ids, Iterable):
        raise TypeError(
            f"request_ids must be a sequence of request ids (e.g. [{request_ids!r}]), "
            f"got {type(request_ids).__name__}"
        )


def _check_bytes(num_bytes: Any) -> None:
    if num_bytes is None:
        return
    if not isinstance(num_bytes, int) or isinstance(num_bytes, bool) or num_bytes < 0:
        raise TypeError(f"num_bytes must be a non-negative int count of bytes or None, got {num_bytes!r}")


def _batch_off(
    request_ids: Sequence[Any], ts: float | None = None, cached_tokens: Sequence[int] | None = None
) -> None:
    """scheduled/preempted of a tracker whose providers are both no-op (``cached_tokens``: scheduled's)."""
    _check_ids(request_ids)


def _tokens_off(
    request_ids: Sequence[Any], ts: float | None = None, counts: Sequence[int] | None = None
) -> None:
    """tokens of a tracker whose providers are both no-op."""
    _check_ids(request_ids)


class RequestTracker:
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
        if role not in sc.ROLES:
            raise ValueError(f"role must be one of {', '.join(map(repr, sc.ROLES))}, got {role!r}")
        if tail_sampling is None:
            tail_sampling = TailSampling.from_env()
        elif tail_sampling is True:
            tail_sampling = TailSampling()
        off = tail_sampling is None or tail_sampling is False
        if not off and not isinstance(tail_sampling, TailSampling):
            raise TypeError(
                f"tail_sampling must be a TailSampling, False or None, got {type(tail_sampling).__name__}"
            )
        detail = resolve_detail(trace_detail)
        if not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be a positive int, got {max_in_flight!r}")
        if not isinstance(max_age_s, (int, float)) or not max_age_s > 0:
            raise ValueError(f"max_age_s must be a positive number of seconds, got {max_age_s!r}")
        for name, value in (
            ("model", model),
            ("provider_name", provider_name),
            ("operation_name", operation_name),
        ):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        base: dict[str, Any] = {
            sc.GEN_AI_PROVIDER_NAME: provider_name,
            sc.GEN_AI_OPERATION_NAME: operation_name,
        }
        if model is not None:
            base[sc.GEN_AI_REQUEST_MODEL] = model
        if role != sc.ROLE_BOTH:
            base[sc.LLM_ROLE] = role
        for key, value in (attributes or {}).items():
            if not isinstance(key, str) or not isinstance(value, (str, int, float, bool)):
                raise TypeError(f"attributes must map str to str, int, float or bool, got {key!r}: {value!r}")
            base.setdefault(key, value)  # the tracker's own attributes above keep their values
        self.role = role
        if span_hook is not None and not callable(span_hook):
            raise TypeError(
                f"span_hook must be a callable (span, finished_request) -> None, got {span_hook!r}"
            )
        self.model = model
        self.max_in_flight = max_in_flight
        self.max_age_s = float(max_age_s)
        self._base = base
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._lock = threading.Lock()
        _LIVE_TRACKERS.add(self)
        self._inflight: dict[Any, Timeline] = {}
        self._states = [0, 0, 0]  # requests in flight by state: WAITING, RUNNING, PREEMPTED
        self._prev_step = _NO_STEP  # the previous tokens() call
        # The request ids of the previous tokens() call (a copy) while every one of them points at
        # _prev_step and nothing else does; None when that does not hold (see tokens()).
        self._batch: list[Any] | tuple[Any, ...] | None = None
        self._anomalies = an.AnomalyCounter()
        self._evicted = 0
        self.clock = Clock()  # monotonic -> wall-clock, for every time this tracker and its engine export
        self._spans = SpanBuilder(tracer_provider, base, self.clock, detail)
        self.trace_detail = detail
        # The last engine steps, for llm.engine.step spans (detail "steps" only: one append per step).
        self._step_log: StepLog | None = StepLog() if detail == DETAIL_STEPS else None
        self._metrics = RequestMetrics(meter_provider, base, self._lock)
        self._engine_state = EngineState(self._metrics)
        self._tail: TailSampler | None = None
        if isinstance(tail_sampling, TailSampling):
            self._tail = TailSampler(tail_sampling)
            self._metrics.observe(
                sc.METRIC_SAMPLING_DECISIONS,
                sc.UNIT_DECISION,
                "Tail sampling decisions at finished(), by decision (keep / drop) and reason",
                self._tail.observe,
                counter=True,
            )
        self._finisher = Finisher(
            self._spans,
            self._metrics,
            self.clock,
            base,
            self._tail,
            self._step_log,
            span_hook,
            self._lock,
            self._note,
            self._adopt_itl,
        )
        self._finish = self._finisher.finish
        self._itl = self._metrics.itl  # inter-token latency: added to on the hot path, under self._lock
        self._metrics.observe(
            sc.METRIC_ACTIVE,
            sc.UNIT_REQUEST,
            "Requests in flight by state",
            self._observe_active,
            counter=False,
        )
        self._metrics.observe(
            sc.METRIC_ANOMALIES,
            sc.UNIT_ANOMALY,
            "Lifecycle anomalies by kind",
            self._observe_anomalies,
            counter=True,
        )
        self._metrics.observe(
            sc.METRIC_EVICTED,
            sc.UNIT_REQUEST,
            "Requests closed as evicted (never finished)",
            lambda: [(self._evicted, {})],
            counter=True,
        )
        if isinstance(tracer_provider, trace.NoOpTracerProvider) and isinstance(
            meter_provider, metrics.NoOpMeterProvider
        ):
            # Telemetry is off for good: no span or metric can ever show what the batch hooks record, so
            # they only check their arguments; queued/finished/traceparent still work (propagation).
            self.scheduled = self.preempted = _batch_off  # type: ignore[method-assign]
            self.tokens = _tokens_off  # type: ignore[method-assign]

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
        if prompt_tokens is not None and (
            not isinstance(prompt_tokens, int) or isinstance(prompt_tokens, bool)
        ):
            raise TypeError(
                f"prompt_tokens must be an int count of prompt tokens, got {type(prompt_tokens).__name__}"
            )
        if attributes is not None and not isinstance(attributes, Mapping):
            raise TypeError(
                f"attributes must be a mapping of attribute name to value, got {type(attributes).__name__}"
            )
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
        with self._lock:
            for kind in problems:
                self._anomalies.note(kind, request_id)
            if arrival > ts:
                self._anomalies.note(an.ARRIVAL_AFTER_QUEUED, request_id)
                arrival = ts
            evicted: list[FinishedRequest] = []
            if request_id in self._inflight:
                self._anomalies.note(an.DUPLICATE_QUEUED, request_id)
            else:
                evicted = self._due_evictions(ts, incoming=1)
                tl = self._inflight[request_id] = Timeline(
                    request_id, ts, arrival, prompt_tokens, trace_id, span_id, parent, user_attributes
                )
                if handed is not None:
                    tl.handed_in = True
                    tl.prefill_kept = handed.prefill_kept
                    self._spans.identity.continue_sampling(tl, handed.sampled)
                self._states[WAITING] += 1
        if self._anomalies.unlogged:
            self._anomalies.log_pending()
        self._finish_all(evicted)

    def scheduled(
        self, request_ids: Sequence[Any], ts: float | None = None, cached_tokens: Sequence[int] | None = None
    ) -> None:
        """These requests entered the running batch: the first time (S1) or after a preemption (R_k).

        ``cached_tokens``: per request, the tokens found in the engine's prefix cache (not computed).
        At the first scheduling: prompt tokens, kept as ``gen_ai.usage.cache_read.input_tokens`` on
        ``llm.request``. At a rescheduling: tokens of its context (prompt + output so far); the rest is
        what the engine recomputes (``llm.recompute.tokens``, see ``otel_llm.recompute``)."""
        _check_ids(request_ids)
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
        _check_ids(request_ids)
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
                prev = _NO_STEP  # a step out of order: every request takes the checked path
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
                if isinstance(counts, (str, bytes)) or not isinstance(counts, Sequence):
                    raise TypeError(
                        f"counts must be a sequence of ints, one per request id, got {type(counts).__name__}"
                    )
                if len(counts) != len(request_ids):
                    raise ValueError(f"counts has {len(counts)} entries for {len(request_ids)} request ids")
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

    def _scheduled_cached(self, request_ids: Sequence[Any], ts: float | None, cached: Sequence[int]) -> None:
        """scheduled() with a prefix-cache hit count per request."""
        if isinstance(cached, (str, bytes)) or not isinstance(cached, Sequence):
            raise TypeError(f"cached_tokens must be a sequence of ints, one per request id, got {cached!r}")
        ids = list(request_ids)
        if len(cached) != len(ids):
            raise ValueError(f"cached_tokens has {len(cached)} entries for {len(ids)} request ids")
        counts = [count("cached_tokens", n) for n in cached]
        first, again = [], []
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

    def engine_state(
        self,
        *,
        kv_cache_usage: float | None = None,
        running: int | None = None,
        waiting: int | None = None,
        prefix_cache_queries: int = 0,
        prefix_cache_hits: int = 0,
        spec_drafted_tokens: int = 0,
        spec_accepted_tokens: int = 0,
        step_tokens: int | None = None,
        prompt_tokens_computed: int = 0,
        prompt_tokens_cached: int = 0,
        prompt_tokens_transferred: int = 0,
    ) -> None:
        """What the engine knows of itself, once per step (after its ``tokens()``) or per stats interval.

        Gauges (latest value wins): ``kv_cache_usage`` (fraction of KV blocks in use, 0..1), ``running``
        and ``waiting`` (requests, as the engine's scheduler counts them). Increments since the previous
        call: ``prefix_cache_queries`` / ``prefix_cache_hits`` (prompt tokens looked up / found cached),
        ``spec_drafted_tokens`` / ``spec_accepted_tokens`` (speculative decoding). ``step_tokens``: tokens
        fed to the model in this step, one histogram sample. ``prompt_tokens_computed`` / ``_cached`` /
        ``_transferred``: the prompt tokens of requests scheduled for the first time since the previous
        call, by where they came from (computed, local prefix cache, a KV transfer), as vLLM's
        ``vllm:prompt_tokens_by_source`` counts them. None / 0 means "not reported". Only stores
        numbers; the metrics are read at collection time (``otel_llm.engine_state``)."""
        kv, step = self._engine_state.report(
            kv_cache_usage,
            running,
            waiting,
            prefix_cache_queries,
            prefix_cache_hits,
            spec_drafted_tokens,
            spec_accepted_tokens,
            step_tokens,
            prompt_tokens_computed,
            prompt_tokens_cached,
            prompt_tokens_transferred,
        )
        log = self._step_log
        if log is not None and (step is not None or kv is not None):
            with self._lock:
                latest = log.latest()
                if latest is not None:
                    latest.tokens = step if step is not None else latest.tokens
                    latest.kv_cache_usage = kv if kv is not None else latest.kv_cache_usage

    def preempted(self, request_ids: Sequence[Any], ts: float | None = None) -> None:
        """The KV cache of these running requests was evicted (P_k); they wait to be recomputed."""
        _check_ids(request_ids)
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
        if not isinstance(reason, str):
            raise TypeError(
                f"reason must be a str such as 'stop', 'length', 'abort' or 'error', got {reason!r}"
            )
        ts = self._timestamp(ts)
        with self._lock:
            tl = self._inflight.pop(request_id, None)
            done = None
            self._batch = None  # its Step must not move on: its count and latest token are read from it
            if tl is None:
                self._anomalies.note(an.UNKNOWN_REQUEST, request_id)
            else:
                self._states[tl.state] -= 1
                done = FinishedRequest(tl, self._clamp(tl, ts), reason, error)
                evicted = self._due_evictions(ts, incoming=0)
        if self._anomalies.unlogged:
            self._anomalies.log_pending()
        if done is None:
            return
        self._finish(done)
        self._finish_all(evicted)

    def kv_sent(self, request_id: Any, *, ts: float | None = None, num_bytes: int | None = None) -> None:
        """Prefill instance: the request's KV cache was sent to a decode instance (K = ``ts``), which
        finishes the request; here it ends (its spans and this instance's values are recorded now).
        ``num_bytes``: the KV cache's size, when known."""
        _check_bytes(num_bytes)
        ts = self._timestamp(ts)
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

    def kv_received(self, request_id: Any, *, ts: float | None = None, num_bytes: int | None = None) -> None:
        """Decode instance: the request's KV cache, sent by the prefill instance, is in this instance
        (K = ``ts``, after ``queued``); the request now waits to be scheduled. ``num_bytes`` when known."""
        _check_bytes(num_bytes)
        ts = self._timestamp(ts)
        with self._lock:
            tl = self._inflight.get(request_id)
            if tl is None:
                self._anomalies.note(an.UNKNOWN_REQUEST, request_id)
            else:
                tl.kv_done = tl.last_event = self._clamp(tl, ts)
                tl.kv_bytes = num_bytes
        if self._anomalies.unlogged:
            self._anomalies.log_pending()

    def handoff_carrier(self, request_id: Any) -> dict[str, str] | None:
        """What a prefill instance sends with the request's KV cache so that the decode instance's
        tracker continues its trace (``queued(carrier=...)`` there): string keys and values, to put in
        the transfer's metadata. None for an unknown request. See ``otel_llm.handoff``."""
        traceparent = self.traceparent(request_id)
        with self._lock:
            tl = self._inflight.get(request_id)
        if traceparent is None or tl is None:
            return None
        # Tail sampling decides now what kv_sent() will: on a prefill instance no rule depends on the
        # transfer (a handed-off request has no TTFT or e2e here), so the decision travels with it.
        kept = True
        if self._tail is not None:
            fin = FinishedRequest(tl, tl.last_event, sc.REASON_HANDED_OFF, None, handed_off=True)
            kept = self._tail.would_keep(fin, Intervals(fin))
        return make_carrier(traceparent, parent_span_context(tl.parent), tl.arrival, self.clock, kept)

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
        with self._lock:
            evicted = self._due_evictions(_monotonic(), incoming=0)
        self._finish_all(evicted)
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

    def __contains__(self, request_id: object) -> bool:
        """Whether ``request_id`` is queued and not yet finished (or evicted)."""
        return request_id in self._inflight

    @property
    def tracer_provider(self) -> trace.TracerProvider | None:
        """The tracer provider given at construction (None: the global one)."""
        return self._tracer_provider

    @property
    def in_flight(self) -> int:
        """Number of requests queued and not yet finished."""
        return len(self._inflight)

    @property
    def anomaly_counts(self) -> dict[str, int]:
        """Lifecycle anomalies seen so far, by kind (also exported as ``otel_llm.anomalies``)."""
        with self._lock:
            return dict(self._anomalies.counts)

    # --- internals (callers hold self._lock unless stated) -----------------------------------------

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

    def _clamp(self, tl: Timeline, ts: float) -> float:
        """No event of a request is earlier than its previous one, so no duration is negative."""
        floor = tl.last_event
        if tl.last_token is not None and tl.last_token > floor:
            floor = tl.last_token
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
            self._itl.add(ts - tl.latest_token(), 1)
        if tl.preemptions:
            last = tl.preemptions[-1]
            if last.rescheduled is not None and last.recomputed is None:
                last.recomputed = ts  # T_k
        tokens = tl.output_tokens + n
        tl.step = step
        tl.token_base = tokens - step.index
        tl.last_event = ts
        return apart

    def _due_evictions(self, now: float, incoming: int) -> list[FinishedRequest]:
        """Pop requests past max_age_s, and the oldest while over max_in_flight (insertion order)."""
        inflight = self._inflight
        if not inflight:
            return []
        out: list[FinishedRequest] = []
        horizon = now - self.max_age_s
        while inflight:
            rid, tl = next(iter(inflight.items()))
            if tl.queued >= horizon and len(inflight) + incoming <= self.max_in_flight:
                break
            del inflight[rid]
            self._batch = None
            self._states[tl.state] -= 1
            self._evicted += 1
            out.append(FinishedRequest(tl, max(now, tl.last_event), sc.REASON_EVICTED, None))
        return out

    def _finish_all(self, done: list[FinishedRequest]) -> None:
        for fin in done:
            self._finish(fin)

    def _adopt_itl(self, itl: Any) -> None:
        """Called under self._lock when the metrics moved to another provider's recorders."""
        self._itl = itl

    def _note(self, kind: str, request_id: Any) -> None:
        """Count an anomaly from outside the lock (the finishing pipeline), and log it once."""
        with self._lock:
            self._anomalies.note(kind, request_id)
        self._anomalies.log_pending()

    # --- observable callbacks (run in the metric reader's thread) --------------------------------

    def _observe_active(self) -> list[tuple[float, dict[str, Any]]]:
        self._metrics.resolve(self._adopt_itl)  # a provider set since: its next collection has our histograms
        waiting, running, preempted = self._states
        return [
            (waiting, {sc.LLM_REQUEST_STATE: sc.STATE_WAITING}),
            (running, {sc.LLM_REQUEST_STATE: sc.STATE_RUNNING}),
            (preempted, {sc.LLM_REQUEST_STATE: sc.STATE_PREEMPTED}),
        ]

    def _observe_anomalies(self) -> list[tuple[float, dict[str, Any]]]:
        with self._lock:
            counts = list(self._anomalies.counts.items())
        return [(n, {sc.LLM_ANOMALY_KIND: kind}) for kind, n in counts]
