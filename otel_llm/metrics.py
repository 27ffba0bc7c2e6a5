"""A finished request -> its metric values, counted by otel_llm itself under one short lock.

Nothing here calls the OpenTelemetry SDK on the request path: an SDK ``Histogram.record`` or
``Counter.add`` costs microseconds (attribute hashing, exemplar sampling, its own locks), and a request
has about ten of them, which would cost as much as building its spans. Instead:

- the latency histograms are ``otel_llm.histogram.BucketHistogram`` s (one per attribute set), each
  bucket keeping the latest exemplar of a sampled request span, handed to the pipeline at collection
  time through ``otel_llm.export.preaggregated`` (the same path as inter-token latency);
- the counters are plain ints read by observable counters, which work with any MeterProvider.

Exponential histograms (``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`` set to
``base2_exponential_bucket_histogram``) cannot be built from explicit buckets, so with that setting the
latencies are recorded through SDK histograms instead, at the SDK's cost (inter-token latency stays
explicit and pre-aggregated).

Values are seconds (monotonic differences, see ``otel_llm.intervals``); exemplar times are wall-clock
nanoseconds of the request's end.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from opentelemetry import metrics
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, set_span_in_context

from otel_llm import semconv as sc
from otel_llm._version import __version__
from otel_llm.export.preaggregated import PreAggregatedSource
from otel_llm.export.preferences import ENV_HISTOGRAM_AGGREGATION
from otel_llm.histogram import BucketHistogram, SpanRef
from otel_llm.intervals import Intervals
from otel_llm.observables import ObserveFn, Observer, observe
from otel_llm.timeline import FinishedRequest

# The SDK's variable for its exemplar filter; honoured here for the exemplars otel_llm keeps itself.
ENV_EXEMPLAR_FILTER = "OTEL_METRICS_EXEMPLAR_FILTER"
EXPONENTIAL = "base2_exponential_bucket_histogram"


class RequestMetrics:
    """The request-level metrics of one tracker. ``base`` attributes go on every point."""

    def __init__(self, meter_provider: metrics.MeterProvider | None, base: dict[str, Any]) -> None:
        self._provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        self._base = dict(base)
        # Observable instruments are shared by the trackers of one provider; this one reports while
        # it lives (see otel_llm.observables).
        self._observer = Observer(self._base)
        # Guards every histogram and counter below; never held across I/O (nor across SDK calls, but for
        # the exponential fallback's Histogram.record, which never calls back into otel_llm).
        self._lock = threading.Lock()
        self._exemplars = _exemplar_filter()
        self.sources: list[PreAggregatedSource] = []
        # Exponential histograms cannot be built from explicit buckets: when they are asked for, the
        # latencies go through SDK instruments (and cost what SDK measurements cost).
        self._sdk = os.environ.get(ENV_HISTOGRAM_AGGREGATION, "").strip().lower() == EXPONENTIAL
        meter = self._provider.get_meter("otel_llm", __version__) if self._sdk else None

        def hist(name: str, buckets: tuple[float, ...], description: str) -> _Latency | _SdkLatency:
            if meter is not None:
                instrument = meter.create_histogram(
                    name,
                    unit=sc.UNIT_SECONDS,
                    description=description,
                    explicit_bucket_boundaries_advisory=buckets,
                )
                return _SdkLatency(instrument, self._base)
            source = PreAggregatedSource(name, sc.UNIT_SECONDS, description)
            self.sources.append(source)
            return _Latency(source, BucketHistogram(buckets, self._base, self._lock))

        self.ttft = hist(sc.METRIC_TTFT, sc.BUCKETS_TTFT, "Time to first token: first tokens event - arrival")
        self.tpot = hist(
            sc.METRIC_TPOT,
            sc.BUCKETS_TPOT,
            "Time per output token after the first: (last - first token) / (output tokens - 1)",
        )
        self.duration = hist(
            sc.METRIC_REQUEST_DURATION, sc.BUCKETS_REQUEST_DURATION, "Request duration: finished - arrival"
        )
        self.queue = hist(sc.METRIC_QUEUE, sc.BUCKETS_PHASE, "Queue time: first scheduled - queued")
        self.prefill = hist(
            sc.METRIC_PREFILL, sc.BUCKETS_PHASE, "Prefill time: first token - first scheduled"
        )
        self.decode = hist(sc.METRIC_DECODE, sc.BUCKETS_PHASE, "Decode time: last token - first token")
        self.inference = hist(
            sc.METRIC_INFERENCE, sc.BUCKETS_PHASE, "Inference time: last token - first scheduled"
        )
        self.preempted = hist(
            sc.METRIC_PREEMPTED,
            sc.BUCKETS_PHASE,
            "Time a request spent evicted, per preemption: rescheduled - preempted",
        )
        self.recompute = hist(
            sc.METRIC_RECOMPUTE,
            sc.BUCKETS_PHASE,
            "KV-cache recompute time, per preemption: next token - rescheduled",
        )
        # Failed requests' durations carry error.type: one histogram per distinct value.
        self._failed_duration: dict[str, _Latency | _SdkLatency] = {}

        # Counter totals since the tracker started, by attribute set (plain ints: an add is all the
        # request path pays); reported by observable counters at collection time.
        self.requests: dict[str, int] = {}
        self.input_tokens = 0
        self.output_tokens = 0
        self.preemptions = 0
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

    def observe(
        self,
        name: str,
        unit: str,
        description: str,
        callback: ObserveFn,
        *,
        counter: bool,
    ) -> None:
        """Register an asynchronous instrument whose values ``callback`` yields at collection time."""
        observe(self._provider, self._observer, name, unit, description, callback, counter=counter)

    def renew_lock(self) -> None:
        """A fresh lock for every histogram (a forked child must not inherit a held one)."""
        lock = self._lock = threading.Lock()
        latencies = (self.ttft, self.tpot, self.duration, self.queue, self.prefill, self.decode)
        for latency in (*latencies, self.inference, self.preempted, self.recompute):
            if isinstance(latency, _Latency):
                latency.hist._lock = lock
        for latency in self._failed_duration.values():
            if isinstance(latency, _Latency):
                latency.hist._lock = lock

    def record(
        self,
        fin: FinishedRequest,
        iv: Intervals,
        span: SpanContext | None,
        error_type: str | None,
        time_ns: int,
    ) -> None:
        """Every value lifecycle.md defines for this request; TTFT and TPOT skip failed requests.

        ``span``: the request span's context, whose ids become the exemplars when the exemplar filter
        lets them (by default: when the span is sampled). ``time_ns``: wall-clock time of the request's
        end, the exemplars' time.
        """
        ref: Any = None  # what each latency's add() links its sample to
        mode = self._exemplars
        if self._sdk:
            if span is not None and span.is_valid:  # the SDK applies its own exemplar filter
                ref = set_span_in_context(NonRecordingSpan(span))
        elif (
            span is not None
            and mode is not _OFF
            and span.is_valid
            and (mode is _ALWAYS or span.trace_flags.sampled)
        ):
            ref = (time_ns, span.trace_id, span.span_id)
        tl = fin.timeline
        with self._lock:
            (self.duration if error_type is None else self._failed(error_type)).add(iv.e2e, ref)
            self.requests[fin.reason] = self.requests.get(fin.reason, 0) + 1
            if iv.queue is not None:
                self.queue.add(iv.queue, ref)
            if iv.prefill is not None:
                self.prefill.add(iv.prefill, ref)
                self.decode.add(iv.decode, ref)
                self.inference.add(iv.inference, ref)
                if not iv.failed:
                    self.ttft.add(iv.ttft, ref)
                    if iv.tpot is not None:
                        self.tpot.add(iv.tpot, ref)
            if tl.preemptions:
                self.preemptions += len(tl.preemptions)
                end = fin.finished
                for p in tl.preemptions:
                    resumed = p.rescheduled
                    self.preempted.add((resumed if resumed is not None else end) - p.preempted, ref)
                    if resumed is not None and p.recomputed is not None:
                        self.recompute.add(p.recomputed - resumed, ref)
            if tl.prompt_tokens:
                self.input_tokens += tl.prompt_tokens
            self.output_tokens += tl.output_tokens

    def _failed(self, error_type: str) -> _Latency | _SdkLatency:
        """The duration histogram of failed requests with this error.type (caller holds the lock)."""
        latency = self._failed_duration.get(error_type)
        if latency is None:
            attrs = {**self._base, sc.ERROR_TYPE: error_type}
            duration = self.duration
            if isinstance(duration, _SdkLatency):
                latency = _SdkLatency(duration.instrument, attrs)
            else:
                hist = BucketHistogram(sc.BUCKETS_REQUEST_DURATION, attrs, self._lock)
                latency = _Latency(duration.source, hist)
            self._failed_duration[error_type] = latency
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

    def _observe_preemptions(self) -> list[tuple[float, dict[str, Any]]]:
        return [(self.preemptions, {})] if self.preemptions else []


class _Latency:
    """One attribute set of a latency metric: its histogram, and the source it joins when first used."""

    __slots__ = ("hist", "source")

    def __init__(self, source: PreAggregatedSource, hist: BucketHistogram) -> None:
        self.source = source
        self.hist = hist

    def add(self, value: float, span: SpanRef | None) -> None:
        """One sample (seconds). Caller holds the metrics lock."""
        hist = self.hist
        if not hist.count:  # the first sample: from now on the point is exported, as for an SDK one
            self.source.histograms.append(hist)
        hist.record(value, span)


class _SdkLatency:
    """One attribute set of a latency metric recorded through an SDK histogram (exponential fallback)."""

    __slots__ = ("attributes", "instrument")

    def __init__(self, instrument: Any, attributes: dict[str, Any]) -> None:
        self.instrument = instrument
        self.attributes = attributes

    def add(self, value: float, context: Context | None) -> None:
        self.instrument.record(value, self.attributes, context=context)


_ON_SAMPLED, _ALWAYS, _OFF = object(), object(), object()


def _exemplar_filter() -> object:
    value = os.environ.get(ENV_EXEMPLAR_FILTER, "trace_based").strip().lower()
    if value == "always_on":
        return _ALWAYS
    if value == "always_off":
        return _OFF
    return _ON_SAMPLED
