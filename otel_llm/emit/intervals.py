"""The derived latency values of a finished request's record (vLLM V1's rules; docs/lifecycle.md,
"Values").

All values are seconds computed from monotonic timestamps; None where the request never reached the
point that defines the value. Spans (as ``llm.latency.*`` attributes) and metrics use the same numbers.
"""

from __future__ import annotations

from otel_llm import semconv as sc
from otel_llm.record import RequestRecord


class Intervals:
    """queue = S1 - Q; prefill = F - S1; decode = L - F; inference = L - S1; ttft = F - A; e2e = E - A;
    tpot = (L - F) / (output_tokens - 1). Waiting after a preemption is never queue time: a preemption
    before F lengthens prefill and TTFT, one after F lengthens decode and inference.

    Disaggregated serving (K: the end of the KV transfer on this instance), each instance measuring the
    part of the request it served:

    - prefill instance, request handed off at K: queue = S1 - Q, prefill = F - S1, kv_transfer = K - F
      (the KV cache held and sent after the first token); the request-level values (TTFT, TPOT, e2e,
      decode, inference) belong to the decode instance and are None here;
    - decode instance, request handed in (A is the prefill instance's arrival, carried with the KV):
      kv_transfer = K - Q, queue = S1 - K, decode = inference = L - S1 (its first step already yields a
      token), TTFT = F - A with F the first tokens event here (the first token, produced by the prefill
      instance, is delivered with it), TPOT = (L - F) / (output_tokens - 1), e2e = E - A.
    """

    __slots__ = ("decode", "e2e", "failed", "inference", "kv_transfer", "prefill", "queue", "tpot", "ttft")

    def __init__(self, rec: RequestRecord) -> None:
        s1, first, last = rec.first_scheduled, rec.first_token, rec.last_token
        self.failed = rec.reason in sc.FAILED_REASONS
        self.e2e: float | None = rec.finished - rec.arrival
        self.queue = None if s1 is None else s1 - rec.queued
        self.kv_transfer: float | None = None
        self.prefill: float | None = None
        self.decode: float | None = None
        self.inference: float | None = None
        self.ttft: float | None = None
        self.tpot: float | None = None
        if rec.handed_off:
            self.kv_transfer = rec.finished - (first if first is not None else rec.last_event)
            self.prefill = None if first is None or s1 is None else first - s1
            self.e2e = None
            return
        if rec.handed_in:
            ready = rec.queued if rec.kv_done is None else rec.kv_done
            if rec.kv_done is not None:
                self.kv_transfer = rec.kv_done - rec.queued
            self.queue = None if s1 is None else s1 - ready
        if first is None or s1 is None or last is None:
            return
        self.prefill = first - s1
        self.decode = last - first
        self.inference = last - s1
        self.ttft = first - rec.arrival
        self.tpot = self.decode / (rec.output_tokens - 1) if rec.output_tokens > 1 else None
        if rec.handed_in:
            self.prefill = None
            self.decode = self.inference

    def span_attributes(self) -> dict[str, float]:
        values = {
            sc.LLM_LATENCY_QUEUE: self.queue,
            sc.LLM_LATENCY_PREFILL: self.prefill,
            sc.LLM_LATENCY_DECODE: self.decode,
            sc.LLM_LATENCY_INFERENCE: self.inference,
            sc.LLM_LATENCY_TTFT: self.ttft,
            sc.LLM_LATENCY_E2E: self.e2e,
            sc.LLM_LATENCY_KV_TRANSFER: self.kv_transfer,
        }
        return {key: value for key, value in values.items() if value is not None}
