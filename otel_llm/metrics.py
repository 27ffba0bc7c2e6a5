"""A finished request -> its metric values, recorded once through the OpenTelemetry metrics API.

Per-request histograms are recorded with the request span's context, so a backend that keeps
exemplars can jump from a slow bucket to the trace. Inter-token latency is not recorded here: it has
one sample per token and is counted by the tracker into ``otel_llm.histogram.BucketHistogram``,
which reaches the pipeline through ``otel_llm.export.preaggregated``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation

from otel_llm import semconv as sc
from otel_llm._version import __version__
from otel_llm.intervals import Intervals
from otel_llm.timeline import FinishedRequest


class RequestMetrics:
    """The request-level instruments of one tracker. ``base`` attributes go on every point."""

    def __init__(self, meter_provider: metrics.MeterProvider | None, base: dict[str, Any]) -> None:
        provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        self.meter = meter = provider.get_meter("otel_llm", __version__)
        self._base = dict(base)
        self._by_reason: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        self._input_attrs = {**self._base, sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_TYPE_INPUT}
        self._output_attrs = {**self._base, sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_TYPE_OUTPUT}

        def hist(name: str, buckets: tuple[float, ...], description: str) -> Any:
            return meter.create_histogram(
                name,
                unit=sc.UNIT_SECONDS,
                description=description,
                explicit_bucket_boundaries_advisory=buckets,
            )

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
        self.preemptions = meter.create_counter(
            sc.METRIC_PREEMPTIONS, unit=sc.UNIT_PREEMPTION, description="Preemptions of running requests"
        )
        self.requests = meter.create_counter(
            sc.METRIC_REQUESTS, unit=sc.UNIT_REQUEST, description="Finished requests by finish reason"
        )
        self.tokens = meter.create_counter(
            sc.METRIC_TOKENS,
            unit=sc.UNIT_TOKEN,
            description="Input (prompt) and output tokens of finished requests",
        )

    def observe(
        self,
        name: str,
        unit: str,
        description: str,
        callback: Callable[[], Iterable[tuple[float, dict[str, Any]]]],
        *,
        counter: bool,
    ) -> None:
        """Register an asynchronous instrument whose values ``callback`` yields at collection time."""

        def observations(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(value, {**self._base, **attrs}) for value, attrs in callback()]

        create = (
            self.meter.create_observable_counter if counter else self.meter.create_observable_up_down_counter
        )
        create(name, callbacks=[observations], unit=unit, description=description)

    def _reason_attributes(self, fin: FinishedRequest, error_type: str | None) -> tuple[dict, dict]:
        key = fin.reason if error_type is None else f"{fin.reason}\0{error_type}"
        cached = self._by_reason.get(key)
        if cached is None:
            duration = dict(self._base)
            if error_type is not None:
                duration[sc.ERROR_TYPE] = error_type
            cached = self._by_reason[key] = (duration, {**self._base, sc.LLM_FINISH_REASON: fin.reason})
        return cached

    def record(
        self, fin: FinishedRequest, iv: Intervals, ctx: Context | None, error_type: str | None
    ) -> None:
        """Every value lifecycle.md defines for this request; TTFT and TPOT skip failed requests."""
        base = self._base
        duration_attrs, reason_attrs = self._reason_attributes(fin, error_type)
        self.duration.record(iv.e2e, duration_attrs, context=ctx)
        self.requests.add(1, reason_attrs)
        tl = fin.timeline
        if iv.queue is not None:
            self.queue.record(iv.queue, base, context=ctx)
        if iv.prefill is not None:
            self.prefill.record(iv.prefill, base, context=ctx)
            self.decode.record(iv.decode, base, context=ctx)
            self.inference.record(iv.inference, base, context=ctx)
            if not iv.failed:
                self.ttft.record(iv.ttft, base, context=ctx)
                if iv.tpot is not None:
                    self.tpot.record(iv.tpot, base, context=ctx)
        if tl.preemptions:
            self.preemptions.add(len(tl.preemptions), base)
            end = fin.finished
            for p in tl.preemptions:
                resumed = p.rescheduled
                self.preempted.record(
                    (resumed if resumed is not None else end) - p.preempted, base, context=ctx
                )
                if resumed is not None and p.recomputed is not None:
                    self.recompute.record(p.recomputed - resumed, base, context=ctx)
        if tl.prompt_tokens:
            self.tokens.add(tl.prompt_tokens, self._input_attrs)
        if tl.output_tokens:
            self.tokens.add(tl.output_tokens, self._output_attrs)
