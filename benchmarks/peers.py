"""What users would do instead of otel_llm, written against the same five-call hook so one workload
drives them all. Timestamps are ``time.monotonic()`` seconds; omitted means now.

- ``BareLimit``: the floor. One timestamp per call, then per request a dict lookup and a list append.
- ``NaiveOtel``: the straightforward OpenTelemetry way. A live SDK span per phase per request (queue,
  prefill, decode, preempted, recompute under a request span), root events, and an SDK
  ``Histogram.record`` per token for inter-token latency; request metrics recorded at finish.
- ``VllmProm``: the vLLM way. ``prometheus_client`` histograms, ``observe`` per token for inter-token
  latency and per request for the rest; a counter for preemptions. No traces.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import prometheus_client as prom
from opentelemetry import trace

from otel_llm import semconv as sc

_now = time.monotonic


class BareLimit:
    """The cheapest possible record of the same events: it keeps every timestamp, builds nothing."""

    def __init__(self) -> None:
        self.events: dict[Any, list[float]] = {}

    def queued(self, request_id: Any, ts: float | None = None) -> None:
        self.events[request_id] = [_now() if ts is None else ts]

    def scheduled(self, request_ids: Sequence[Any], ts: float | None = None) -> None:
        ts = _now() if ts is None else ts
        events = self.events
        for rid in request_ids:
            events[rid].append(ts)

    tokens = scheduled
    preempted = scheduled

    def finished(self, request_id: Any, ts: float | None = None) -> None:
        self.events.pop(request_id, None)


class _Live:
    __slots__ = ("arrival", "first", "last", "phase", "root", "scheduled", "tokens")

    def __init__(self, root: Any, phase: Any, arrival: float) -> None:
        self.root = root
        self.phase = phase
        self.arrival = arrival
        self.scheduled: float | None = None
        self.first: float | None = None
        self.last: float | None = None
        self.tokens = 0


class NaiveOtel:
    """Live spans and one SDK measurement per token, as a first OpenTelemetry integration would do."""

    def __init__(self, tracer_provider: Any, meter_provider: Any, model: str = "bench-model") -> None:
        self.tracer = tracer_provider.get_tracer("naive")
        meter = meter_provider.get_meter("naive")
        self.base = {
            sc.GEN_AI_PROVIDER_NAME: "naive",
            sc.GEN_AI_OPERATION_NAME: "text_completion",
            sc.GEN_AI_REQUEST_MODEL: model,
        }
        self.offset_ns = time.time_ns() - time.monotonic_ns()

        def hist(name: str, buckets: tuple[float, ...]) -> Any:
            return meter.create_histogram(name, unit="s", explicit_bucket_boundaries_advisory=buckets)

        self.itl = hist(sc.METRIC_ITL, sc.BUCKETS_ITL)
        self.ttft = hist(sc.METRIC_TTFT, sc.BUCKETS_TTFT)
        self.tpot = hist(sc.METRIC_TPOT, sc.BUCKETS_TPOT)
        self.e2e = hist(sc.METRIC_REQUEST_DURATION, sc.BUCKETS_REQUEST_DURATION)
        self.queue = hist(sc.METRIC_QUEUE, sc.BUCKETS_PHASE)
        self.decode = hist(sc.METRIC_DECODE, sc.BUCKETS_PHASE)
        self.preemptions = meter.create_counter(sc.METRIC_PREEMPTIONS)
        self.requests = meter.create_counter(sc.METRIC_REQUESTS)
        self.output = meter.create_counter(sc.METRIC_TOKENS)
        self.live: dict[Any, _Live] = {}

    def _ns(self, mono_s: float) -> int:
        return self.offset_ns + int(mono_s * 1e9)

    def _switch(self, req: _Live, name: str, ts: float) -> None:
        """End the current phase span at ``ts`` and start ``name`` there, under the request span."""
        t = self._ns(ts)
        req.phase.end(end_time=t)
        req.phase = self.tracer.start_span(name, context=trace.set_span_in_context(req.root), start_time=t)

    def queued(self, request_id: Any, ts: float | None = None) -> None:
        ts = _now() if ts is None else ts
        t = self._ns(ts)
        root = self.tracer.start_span(sc.SPAN_REQUEST, attributes=self.base, start_time=t)
        root.add_event(sc.EVENT_QUEUED, timestamp=t)
        phase = self.tracer.start_span(sc.SPAN_QUEUE, context=trace.set_span_in_context(root), start_time=t)
        self.live[request_id] = _Live(root, phase, ts)

    def scheduled(self, request_ids: Sequence[Any], ts: float | None = None) -> None:
        ts = _now() if ts is None else ts
        for rid in request_ids:
            req = self.live[rid]
            resumed = req.scheduled is not None
            if not resumed:
                req.scheduled = ts
                self.queue.record(ts - req.arrival, self.base)
            self._switch(req, sc.SPAN_RECOMPUTE if resumed else sc.SPAN_PREFILL, ts)
            req.root.add_event(sc.EVENT_SCHEDULED, {sc.LLM_RESUMED: resumed}, timestamp=self._ns(ts))

    def tokens(self, request_ids: Sequence[Any], ts: float | None = None) -> None:
        ts = _now() if ts is None else ts
        base = self.base
        record = self.itl.record
        for rid in request_ids:
            req = self.live[rid]
            if req.first is None:
                req.first = ts
                self.ttft.record(ts - req.arrival, base)
                req.root.add_event(sc.EVENT_FIRST_TOKEN, timestamp=self._ns(ts))
                self._switch(req, sc.SPAN_DECODE, ts)
            else:
                record(ts - req.last, base)
                if req.phase.name == sc.SPAN_RECOMPUTE:
                    self._switch(req, sc.SPAN_DECODE, ts)
            req.last = ts
            req.tokens += 1

    def preempted(self, request_ids: Sequence[Any], ts: float | None = None) -> None:
        ts = _now() if ts is None else ts
        for rid in request_ids:
            req = self.live[rid]
            self.preemptions.add(1, self.base)
            req.root.add_event(sc.EVENT_PREEMPTED, {sc.LLM_OUTPUT_TOKENS: req.tokens}, timestamp=self._ns(ts))
            self._switch(req, sc.SPAN_PREEMPTED, ts)

    def finished(self, request_id: Any, ts: float | None = None) -> None:
        ts = _now() if ts is None else ts
        req = self.live.pop(request_id)
        base = self.base
        t = self._ns(ts)
        req.phase.end(end_time=t)
        self.e2e.record(ts - req.arrival, base)
        if req.first is not None and req.last is not None:
            self.decode.record(req.last - req.first, base)
            if req.tokens > 1:
                self.tpot.record((req.last - req.first) / (req.tokens - 1), base)
        self.requests.add(1, base)
        self.output.add(req.tokens, base)
        req.root.set_attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS, req.tokens)
        req.root.end(end_time=t)


class VllmProm:
    """prometheus_client per token, like vLLM's stat loggers (one registry per instance)."""

    def __init__(self, model: str = "bench-model") -> None:
        registry = prom.CollectorRegistry()
        labels = ["model_name"]

        def hist(name: str, buckets: tuple[float, ...]) -> Any:
            return prom.Histogram(name, name, labels, buckets=buckets, registry=registry).labels(model)

        self.registry = registry
        self.itl = hist("vllm_inter_token_latency_seconds", sc.BUCKETS_ITL)
        self.ttft = hist("vllm_time_to_first_token_seconds", sc.BUCKETS_TTFT)
        self.tpot = hist("vllm_time_per_output_token_seconds", sc.BUCKETS_TPOT)
        self.e2e = hist("vllm_e2e_request_latency_seconds", sc.BUCKETS_REQUEST_DURATION)
        self.queue = hist("vllm_request_queue_time_seconds", sc.BUCKETS_PHASE)
        self.preemptions = prom.Counter("vllm_num_preemptions", "", labels, registry=registry).labels(model)
        self.generated = prom.Counter("vllm_generation_tokens", "", labels, registry=registry).labels(model)
        # request id -> [arrival, first scheduled, first token, last token, tokens]
        self.live: dict[Any, list[Any]] = {}

    def queued(self, request_id: Any, ts: float | None = None) -> None:
        self.live[request_id] = [_now() if ts is None else ts, None, None, None, 0]

    def scheduled(self, request_ids: Sequence[Any], ts: float | None = None) -> None:
        ts = _now() if ts is None else ts
        for rid in request_ids:
            req = self.live[rid]
            if req[1] is None:
                req[1] = ts
                self.queue.observe(ts - req[0])

    def tokens(self, request_ids: Sequence[Any], ts: float | None = None) -> None:
        ts = _now() if ts is None else ts
        observe = self.itl.observe
        live = self.live
        for rid in request_ids:
            req = live[rid]
            if req[2] is None:
                req[2] = ts
                self.ttft.observe(ts - req[0])
            else:
                observe(ts - req[3])
            req[3] = ts
            req[4] += 1

    def preempted(self, request_ids: Sequence[Any], ts: float | None = None) -> None:
        self.preemptions.inc(len(request_ids))

    def finished(self, request_id: Any, ts: float | None = None) -> None:
        ts = _now() if ts is None else ts
        req = self.live.pop(request_id)
        self.e2e.observe(ts - req[0])
        if req[2] is not None and req[4] > 1:
            self.tpot.observe((req[3] - req[2]) / (req[4] - 1))
        self.generated.inc(req[4])
