"""The derived latency values of a finished request (vLLM V1's rules; lifecycle.md, "Metric values").

All values are seconds computed from monotonic timestamps; None where the request never reached the
point that defines the value. Spans (as ``llm.latency.*`` attributes) and metrics use the same numbers.
"""

from __future__ import annotations

from otel_llm import semconv as sc
from otel_llm.timeline import FinishedRequest


class Intervals:
    """queue = S1 - Q; prefill = F - S1; decode = L - F; inference = L - S1; ttft = F - A; e2e = E - A;
    tpot = (L - F) / (output_tokens - 1). Waiting after a preemption is never queue time: a preemption
    before F lengthens prefill and TTFT, one after F lengthens decode and inference."""

    __slots__ = ("decode", "e2e", "failed", "inference", "prefill", "queue", "tpot", "ttft")

    def __init__(self, fin: FinishedRequest) -> None:
        tl = fin.timeline
        s1, first, last = tl.first_scheduled, tl.first_token, fin.last_token
        self.failed = fin.reason in sc.FAILED_REASONS
        self.e2e = fin.finished - tl.arrival
        self.queue = None if s1 is None else s1 - tl.queued
        if first is None or s1 is None or last is None:
            self.prefill = self.decode = self.inference = self.ttft = self.tpot = None
            return
        self.prefill = first - s1
        self.decode = last - first
        self.inference = last - s1
        self.ttft = first - tl.arrival
        self.tpot = self.decode / (tl.output_tokens - 1) if tl.output_tokens > 1 else None

    def span_attributes(self) -> dict[str, float]:
        values = {
            sc.LLM_LATENCY_QUEUE: self.queue,
            sc.LLM_LATENCY_PREFILL: self.prefill,
            sc.LLM_LATENCY_DECODE: self.decode,
            sc.LLM_LATENCY_INFERENCE: self.inference,
            sc.LLM_LATENCY_TTFT: self.ttft,
            sc.LLM_LATENCY_E2E: self.e2e,
        }
        return {key: value for key, value in values.items() if value is not None}
