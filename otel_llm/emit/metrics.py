"""A finished request's record -> its metric values, counted by otel_llm itself under one short lock.

Nothing here calls the OpenTelemetry SDK on the request path when it can be avoided: an SDK
``Histogram.record`` costs microseconds (attribute hashing, exemplar sampling, its own locks), and a
request has about ten latency values plus an inter-token gap per engine step. So, by provider:

- an SDK ``MeterProvider`` (the usual case): every histogram is an ``otel_llm.emit.histogram.BucketHistogram``
  (one per attribute set; each bucket keeps the latest exemplar of a request span) and
  ``otel_llm.emit.sdk_bridge`` hands the counts to each of the provider's readers at collection time. A
  metric the SDK would shape differently (a View matches it, a reader prefers another aggregation) is
  recorded through a real SDK histogram instead, so the View applies exactly;
- any other API implementation: plain API histograms, one ``record`` per value (correct, slower);
- the global proxy before a real provider is set: bucket counts, handed over once one is set
  (``resolve()``, called by the tracker when requests finish, on flush and at collection).

The counters are plain ints read by observable counters, which work with any MeterProvider.

Values are seconds (monotonic differences, see ``otel_llm.emit.intervals``); exemplar times are wall-clock
nanoseconds of the request's end. The recorder of one attribute set and the exemplar filter are
``otel_llm.emit.recorders``. Only the OpenTelemetry API is imported here; the SDK bridge is imported when
the provider is an SDK one, which means the SDK is loaded already.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics
from opentelemetry.trace import NonRecordingSpan, SpanContext, set_span_in_context

from otel_llm import semconv as sc
from otel_llm._version import __version__
from otel_llm.emit import meter_providers
from otel_llm.emit.histogram import BucketHistogram, HistogramSource
from otel_llm.emit.intervals import Intervals
from otel_llm.emit.observables import ObserveFn, Observer, observe
from otel_llm.emit.recompute import RecomputeCounters
from otel_llm.emit.recorders import (
    ExemplarRef,
    InstrumentBulk,
    InstrumentLatency,
    Latency,
    bucket_ref,
    create_histogram,
    env_exemplar_mode,
)
from otel_llm.record import RequestRecord

# (attribute, metric name, bucket boundaries, description) of each request-level latency histogram.
_LATENCIES = (
    ("ttft", sc.METRIC_TTFT, sc.BUCKETS_TTFT, "Time to first token: first tokens event - arrival"),
    (
        "tpot",
        sc.METRIC_TPOT,
        sc.BUCKETS_TPOT,
        "Time per output token after the first: (last - first token) / (output tokens - 1)",
    ),
    (
        "duration",
        sc.METRIC_REQUEST_DURATION,
        sc.BUCKETS_REQUEST_DURATION,
        "Request duration: finished - arrival",
    ),
    ("queue", sc.METRIC_QUEUE, sc.BUCKETS_PHASE, "Queue time: first scheduled - queued"),
    ("prefill", sc.METRIC_PREFILL, sc.BUCKETS_PHASE, "Prefill time: first token - first scheduled"),
    ("decode", sc.METRIC_DECODE, sc.BUCKETS_PHASE, "Decode time: last token - first token"),
    ("inference", sc.METRIC_INFERENCE, sc.BUCKETS_PHASE, "Inference time: last token - first scheduled"),
    (
        "preempted",
        sc.METRIC_PREEMPTED,
        sc.BUCKETS_PHASE,
        "Time a request spent evicted, per preemption: rescheduled - preempted",
    ),
    (
        "recompute",
        sc.METRIC_RECOMPUTE,
        sc.BUCKETS_PHASE,
        "KV-cache recompute time, per preemption that reached a token: next token - rescheduled",
    ),
    (
        "step_tokens",
        sc.METRIC_STEP_TOKENS,
        sc.BUCKETS_STEP_TOKENS,
        "Tokens the engine fed its model in one step (from RequestTracker.engine_state)",
    ),
    (
        "kv_transfer",
        sc.METRIC_KV_TRANSFER,
        sc.BUCKETS_PHASE,
        "KV-cache transfer of a disaggregated request, per instance (llm.role): sent - first token on "
        "the prefill instance, received - queued on the decode instance",
    ),
)
# Histograms whose values are not seconds.
_UNITS = {sc.METRIC_STEP_TOKENS: sc.UNIT_TOKEN}
ENV_ENGINE_TIME_ATTRIBUTES = "OTEL_LLM_ENGINE_TIME_ATTRIBUTES"
_ITL_DESCRIPTION = "Inter-token latency: gap between consecutive tokens events"
_STALLED_DESCRIPTION = (
    "Per request and stall cause (llm.stall.cause), its seconds stalled between tokens (engines that "
    "report their batches)"
)


class RequestMetrics:
    """The metrics of one tracker. ``base`` attributes go on every point.

    ``itl`` and ``step_tokens_recorder`` are what the tracker's hot path adds inter-token gaps and
    tokens per step to, under ``itl_lock`` (the tracker's own lock); every other histogram is guarded by
    this object's lock.
    """

    # One recorder per entry of _LATENCIES, set by name in _setup (each a bucket histogram counted here,
    # or an SDK instrument where the provider would shape the metric differently).
    ttft: Latency | InstrumentLatency
    tpot: Latency | InstrumentLatency
    duration: Latency | InstrumentLatency
    queue: Latency | InstrumentLatency
    prefill: Latency | InstrumentLatency
    decode: Latency | InstrumentLatency
    inference: Latency | InstrumentLatency
    preempted: Latency | InstrumentLatency
    recompute: Latency | InstrumentLatency
    step_tokens: Latency | InstrumentLatency
    kv_transfer: Latency | InstrumentLatency
    itl: BucketHistogram | InstrumentBulk  # the hot path's inter-token gaps

    def __init__(
        self, meter_provider: metrics.MeterProvider | None, base: dict[str, Any], itl_lock: threading.Lock
    ) -> None:
        self._given = meter_provider
        self._provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        self._base = dict(base)
        self._itl_lock = itl_lock
        # Observable instruments are shared by the trackers of one provider; this one reports while
        # it lives (see otel_llm.observables).
        self._observer = Observer(self._base)
        # Guards every histogram and counter below; never held across I/O (nor across SDK calls, but for
        # Histogram.record of the instrument path, which never calls back into otel_llm).
        self._lock = threading.Lock()
        self._resolved: Any = None  # the provider the current recorders were made for
        self._sources: list[HistogramSource] = []
        self._setup(meter_providers.resolve(self._given))
        meter_providers.register_owner(self._given, self)

        # Counter totals since the tracker started, by attribute set (plain ints: an add is all the
        # request path pays); reported by observable counters at collection time.
        self.requests: dict[str, int] = {}
        self.input_tokens = 0
        self.output_tokens = 0
        self.preemptions = 0
        self.kv_bytes = 0
        self.observe(
            sc.METRIC_REQUESTS,
            sc.UNIT_REQUEST,
            "Finished requests by finish reason",
            self._observe_requests,
            counter=True,
        )
        self.observe(
            sc.METRIC_TOKENS,
            sc.UNIT_TOKEN,
            "Input (prompt) and output tokens of finished requests",
            self._observe_tokens,
            counter=True,
        )
        self.observe(
            sc.METRIC_PREEMPTIONS,
            sc.UNIT_PREEMPTION,
            "Preemptions of running requests",
            self._observe_preemptions,
            counter=True,
        )
        self.observe(
            sc.METRIC_KV_TRANSFER_BYTES,
            sc.UNIT_BYTES,
            "KV-cache bytes of disaggregated requests: sent (llm.role prefill) or received (decode)",
            self._observe_kv_bytes,
            counter=True,
        )
        self.recompute_work = RecomputeCounters(self.observe)  # tokens recomputed / cached, per preemption
        # Engine seconds of finished requests (the batch() hook), by the values of the request attributes
        # the operator chose, then [first computation, recompute].
        self._engine_time_keys = engine_time_keys()
        self.engine_time: dict[tuple[Any, ...], list[float]] = {}
        self.observe(
            sc.METRIC_ENGINE_TIME,
            sc.UNIT_SECONDS,
            "Engine seconds spent on finished requests: each step's time split among its requests by the "
            "tokens it computed for each (engines that report their batches); llm.engine.work says "
            "whether it was recomputing after a preemption",
            self._observe_engine_time,
            counter=True,
        )

    # --- which recorders, for which provider ----------------------------------------------------------

    def resolve(self, adopt: Callable[[Any, Any], None]) -> None:
        """Re-check the provider the metrics reach (the global one may have been set since). When the
        recorders change, ``adopt(itl, step_tokens)`` is called under the tracker's lock, so the hot path
        moves to the new per-step recorders without losing a sample. Cheap when nothing changed."""
        target = meter_providers.resolve(self._given)
        if target is self._resolved:
            return
        with self._itl_lock, self._lock:
            if target is not self._resolved:
                self._setup(target)
                adopt(self.itl, self.step_tokens_recorder)

    def _setup(self, target: Any) -> None:
        """Make the recorders for ``target`` (caller holds both locks, or is the constructor)."""
        kind = meter_providers.kind(target)
        instrument_for: set[str] = set()
        meter = None
        exemplars: Any = env_exemplar_mode()
        if kind == "sdk":
            from otel_llm.emit import sdk_bridge

            names = [name for _, name, _, _ in _LATENCIES] + [sc.METRIC_ITL, sc.METRIC_STALLED]
            if sdk_bridge.attach(target):
                instrument_for = {n for n in names if sdk_bridge.needs_instrument(target, n, _unit(n))}
            else:
                instrument_for = set(names)
            exemplars = sdk_bridge.exemplar_mode(target)
        elif kind == "api":
            instrument_for = {name for _, name, _, _ in _LATENCIES} | {sc.METRIC_ITL, sc.METRIC_STALLED}
        if instrument_for:
            meter = target.get_meter("otel_llm", __version__)
        self._exemplars = exemplars
        self._meter = meter
        self._instrument_for = instrument_for
        self._instruments: dict[str, Any] = {}
        self._latency_specs = {attr: (name, buckets, desc) for attr, name, buckets, desc in _LATENCIES}
        # Histograms counted so far (on the proxy, before a provider was set) carry over to a provider
        # that takes them as they are; only metrics that move to an instrument start afresh.
        self._sources = [s for s in self._sources if s.name not in instrument_for]
        for attr, name, buckets, desc in _LATENCIES:
            previous = getattr(self, attr, None)
            if name in instrument_for or not isinstance(previous, Latency):
                # Tokens per step are added on the hot path, under the tracker's lock.
                lock = self._itl_lock if attr == "step_tokens" else self._lock
                setattr(self, attr, self._recorder(name, buckets, desc, self._base, lock))
        self.step_tokens_recorder = PerStep(self.step_tokens)
        # Failed requests' durations carry error.type: one recorder per distinct value, made on first use.
        failed: dict[str, Any] = getattr(self, "_failed_duration", {})
        self._failed_duration: dict[str, Latency | InstrumentLatency] = {
            error: latency
            for error, latency in failed.items()
            if isinstance(latency, Latency) and sc.METRIC_REQUEST_DURATION not in instrument_for
        }
        stalled: dict[str, Any] = getattr(self, "_stalled_time", {})
        self._stalled_time: dict[str, Latency | InstrumentLatency] = {
            cause: latency
            for cause, latency in stalled.items()
            if isinstance(latency, Latency) and sc.METRIC_STALLED not in instrument_for
        }
        previous_itl = getattr(self, "itl", None)
        if sc.METRIC_ITL in instrument_for:
            latency = self._recorder(
                sc.METRIC_ITL, sc.BUCKETS_ITL, _ITL_DESCRIPTION, self._base, self._itl_lock
            )
            self.itl = InstrumentBulk(latency)  # type: ignore[arg-type]
        elif not isinstance(previous_itl, BucketHistogram):
            self.itl = BucketHistogram(sc.BUCKETS_ITL, self._base, self._itl_lock)
            # The hot path adds to the histogram itself: it is part of every collection from the start.
            self._source(sc.METRIC_ITL, sc.BUCKETS_ITL, _ITL_DESCRIPTION).histograms.append(self.itl)
        self._resolved = target

    def _recorder(
        self, name: str, buckets: tuple[float, ...], description: str, attrs: dict[str, Any], lock: Any
    ) -> Latency | InstrumentLatency:
        if name in self._instrument_for:
            instrument = self._instruments.get(name)
            if instrument is None:
                instrument = self._instruments[name] = create_histogram(
                    self._meter, name, _unit(name), buckets, description
                )
            return InstrumentLatency(instrument, attrs, lock)
        return Latency(self._source(name, buckets, description), BucketHistogram(buckets, attrs, lock))

    def _source(self, name: str, buckets: tuple[float, ...], description: str) -> HistogramSource:
        for source in self._sources:
            if source.name == name:
                return source
        source = HistogramSource(name, _unit(name), description, buckets)
        self._sources.append(source)
        return source

    def histogram_sources(self) -> Iterable[HistogramSource]:
        """What this tracker contributes to a collection through the SDK bridge."""
        return tuple(self._sources)

    def observe(
        self,
        name: str,
        unit: str,
        description: str,
        callback: ObserveFn,
        *,
        counter: bool,
        gauge: bool = False,
    ) -> None:
        """Register an asynchronous instrument whose values ``callback`` yields at collection time."""
        observe(
            self._provider, self._observer, name, unit, description, callback, counter=counter, gauge=gauge
        )

    @property
    def lock(self) -> threading.Lock:
        """The lock that guards every recorder (and the engine state); a new one after a fork."""
        return self._lock

    def renew_lock(self, itl_lock: threading.Lock) -> None:
        """Fresh locks for every recorder (a forked child must not inherit a held one)."""
        lock = self._lock = threading.Lock()
        self._itl_lock = itl_lock
        for attr, _, _, _ in _LATENCIES:
            getattr(self, attr).renew_lock(itl_lock if attr == "step_tokens" else lock)
        for latency in (*self._failed_duration.values(), *self._stalled_time.values()):
            latency.renew_lock(lock)
        self.itl._lock = itl_lock

    # --- recording ----------------------------------------------------------------------------------

    def record(self, rec: RequestRecord, iv: Intervals, span: SpanContext | None, time_ns: int) -> None:
        """Every value docs/lifecycle.md defines for this request; TTFT and TPOT skip failed requests.

        ``span``: the request span's context, whose ids become the exemplars when the exemplar filter
        lets them (by default: when the span is sampled). ``time_ns``: wall-clock time of the request's
        end, the exemplars' time.
        """
        reason = rec.reason if rec.reason in sc.KNOWN_FINISH_REASONS else sc.REASON_OTHER
        error_type = rec.error_type
        with self._lock:
            ref = self._exemplar_ref(span, time_ns)
            if iv.e2e is not None:  # request-level values: the instance where the request ends
                (self.duration if error_type is None else self._failed(error_type)).add(iv.e2e, ref)
                self.requests[reason] = self.requests.get(reason, 0) + 1
            if iv.queue is not None:
                self.queue.add(iv.queue, ref)
            if iv.prefill is not None:
                self.prefill.add(iv.prefill, ref)
            if iv.decode is not None:
                self.decode.add(iv.decode, ref)
            if iv.inference is not None:  # set together with decode
                self.inference.add(iv.inference, ref)
            if iv.ttft is not None and not iv.failed:
                self.ttft.add(iv.ttft, ref)
                if iv.tpot is not None:
                    self.tpot.add(iv.tpot, ref)
            if iv.kv_transfer is not None:
                self.kv_transfer.add(iv.kv_transfer, ref)
            if rec.kv_bytes:
                self.kv_bytes += rec.kv_bytes
            preemptions = rec.preemptions
            if preemptions:
                self.preemptions += len(preemptions)
                self.recompute_work.add(preemptions)
                end = rec.finished
                for preempted, _, _, resumed, recomputed, _, _ in preemptions:
                    self.preempted.add((resumed if resumed is not None else end) - preempted, ref)
                    if resumed is not None and recomputed is not None:
                        self.recompute.add(recomputed - resumed, ref)
            stalls = rec.stalls
            if stalls:
                for cause, _, seconds in stalls[0]:
                    self._stalled(cause).add(seconds, ref)
            cost = rec.engine_time
            if cost is not None:
                keys = self._engine_time_keys
                key = tuple(map(_hashable, map((rec.attributes or {}).get, keys))) if keys else ()
                totals = self.engine_time.get(key)
                if totals is None:
                    totals = self.engine_time[key] = [0.0, 0.0]
                totals[0] += cost[0] - cost[1]
                totals[1] += cost[1]
            if rec.handed_off:
                return  # its tokens are counted once, by the decode instance that finishes it
            if rec.prompt_tokens:
                self.input_tokens += rec.prompt_tokens
            self.output_tokens += rec.output_tokens

    def _exemplar_ref(self, span: SpanContext | None, time_ns: int) -> Any:
        """What the recorders link a sample to: a (time, trace id, span id) triple for bucket histograms,
        a context for SDK instruments (which apply the provider's filter themselves), or None."""
        if span is None or not span.is_valid:
            return None
        if self._instrument_for:
            # Instruments and bucket histograms may be mixed: the context is wrapped with the triple.
            triple = bucket_ref(self._exemplars, span, time_ns)
            return ExemplarRef(triple, set_span_in_context(NonRecordingSpan(span)))
        return bucket_ref(self._exemplars, span, time_ns)

    def _failed(self, error_type: str) -> Latency | InstrumentLatency:
        """The duration recorder of failed requests with this error.type (caller holds the lock)."""
        latency = self._failed_duration.get(error_type)
        if latency is None:
            name, buckets, desc = self._latency_specs["duration"]
            attrs = {**self._base, sc.ERROR_TYPE: error_type}
            latency = self._failed_duration[error_type] = self._recorder(
                name, buckets, desc, attrs, self._lock
            )
        return latency

    def _stalled(self, cause: str) -> Latency | InstrumentLatency:
        """The stalled-time recorder of one llm.stall.cause (caller holds the lock)."""
        latency = self._stalled_time.get(cause)
        if latency is None:
            attrs = {**self._base, sc.LLM_STALL_CAUSE: cause}
            latency = self._stalled_time[cause] = self._recorder(
                sc.METRIC_STALLED, sc.BUCKETS_PHASE, _STALLED_DESCRIPTION, attrs, self._lock
            )
        return latency

    # --- observable callbacks (run in the metric reader's thread) --------------------------------

    def _observe_requests(self) -> list[tuple[float, dict[str, Any]]]:
        with self._lock:
            counts = list(self.requests.items())
        return [(n, {sc.LLM_FINISH_REASON: reason}) for reason, n in counts]

    def _observe_tokens(self) -> list[tuple[float, dict[str, Any]]]:
        out: list[tuple[float, dict[str, Any]]] = []
        if self.input_tokens:
            out.append((self.input_tokens, {sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_TYPE_INPUT}))
        if self.output_tokens:
            out.append((self.output_tokens, {sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_TYPE_OUTPUT}))
        return out

    def _observe_engine_time(self) -> list[tuple[float, dict[str, Any]]]:
        with self._lock:
            totals = [(key, list(values)) for key, values in self.engine_time.items()]
        keys = self._engine_time_keys
        out: list[tuple[float, dict[str, Any]]] = []
        for key, (first, again) in totals:
            chosen = {k: v for k, v in zip(keys, key) if v is not None}
            out.append((first, {**chosen, sc.LLM_ENGINE_WORK: sc.ENGINE_WORK_COMPUTE}))
            if again:
                out.append((again, {**chosen, sc.LLM_ENGINE_WORK: sc.ENGINE_WORK_RECOMPUTE}))
        return out

    def _observe_preemptions(self) -> list[tuple[float, dict[str, Any]]]:
        return [(self.preemptions, {})] if self.preemptions else []

    def _observe_kv_bytes(self) -> list[tuple[float, dict[str, Any]]]:
        return [(self.kv_bytes, {})] if self.kv_bytes else []


class PerStep:
    """A latency recorder as the tracker's hot path calls it (``add(value, n)``, no exemplar): tokens per
    step, one sample per engine step."""

    __slots__ = ("latency",)

    def __init__(self, latency: Latency | InstrumentLatency) -> None:
        self.latency = latency

    def add(self, value: float, n: int = 1) -> None:
        for _ in range(n):
            self.latency.add(value, None)


def engine_time_keys() -> tuple[str, ...]:
    """The request attributes the engine-time counter is split by: ``OTEL_LLM_ENGINE_TIME_ATTRIBUTES``, a
    comma-separated list of attribute keys (e.g. ``tenant,lora.adapter``); none by default."""
    value = os.environ.get(ENV_ENGINE_TIME_ATTRIBUTES, "")
    return tuple(dict.fromkeys(k.strip() for k in value.split(",") if k.strip()))


def _hashable(value: Any) -> Any:
    """An attribute value as a dict key: a sequence (a list once it crossed to the export process) as a
    tuple."""
    return tuple(value) if isinstance(value, list) else value


def _unit(name: str) -> str:
    return _UNITS.get(name, sc.UNIT_SECONDS)
