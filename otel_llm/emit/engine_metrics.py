"""The engine's own state, as metrics: what ``RequestTracker.engine_state()`` stored, read from the
tracker's figures (``otel_llm.record.Figures``) at collection time.

| metric | instrument | unit | from |
|---|---|---|---|
| ``llm.server.kv_cache.usage`` | gauge | 1 | ``kv_cache_usage``: fraction of KV-cache blocks in use, 0..1 |
| ``llm.server.scheduler.requests`` | gauge | {request} | ``running`` / ``waiting`` (``llm.request.state``) |
| ``llm.server.prefix_cache.queries`` | counter | {token} | ``prefix_cache_queries``: tokens looked up |
| ``llm.server.prefix_cache.hits`` | counter | {token} | ``prefix_cache_hits``: of those, found in the cache |
| ``llm.server.spec_decode.draft_tokens`` | counter | {token} | ``spec_drafted_tokens`` |
| ``llm.server.spec_decode.accepted_tokens`` | counter | {token} | ``spec_accepted_tokens`` |
| ``llm.server.step.tokens`` | histogram | {token} | ``step_tokens``: tokens fed to the model in one step |
| ``llm.server.prompt_tokens`` | counter | {token} | ``prompt_tokens_{computed,cached,transferred}`` |

Counters are the totals of the increments the engine reported; gauges the latest values. A metric is
exported from the first report that gives it on. The prompt tokens go by ``llm.prompt_tokens.source``
(computed, prefix_cache, kv_transfer), each request counted once, at its first scheduling, as vLLM's
``vllm:prompt_tokens_by_source``: a recompute after a preemption is not prompt work
(``llm.server.recompute.tokens`` counts it). The histogram is one of the emitter's latency histograms
(``otel_llm.emit.metrics``), so it reaches every reader through the SDK bridge like the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from otel_llm import semconv as sc
from otel_llm.emit.metrics import RequestMetrics
from otel_llm.record import Figures

# (engine_state() argument, metric name, description) of each counter.
_COUNTERS = (
    ("prefix_cache_queries", sc.METRIC_PREFIX_CACHE_QUERIES, "Prompt tokens looked up in the prefix cache"),
    ("prefix_cache_hits", sc.METRIC_PREFIX_CACHE_HITS, "Prompt tokens found in the prefix cache"),
    ("spec_drafted_tokens", sc.METRIC_SPEC_DRAFT_TOKENS, "Speculative tokens proposed by the drafter"),
    ("spec_accepted_tokens", sc.METRIC_SPEC_ACCEPTED_TOKENS, "Speculative tokens accepted by the target"),
)

Observations = list[tuple[float, dict[str, Any]]]


def register(metrics: RequestMetrics, figures: Callable[[], Figures]) -> None:
    """The engine-state instruments of one tracker on ``metrics``; ``figures``: its figures now."""

    def usage() -> Observations:
        value = figures().kv_cache_usage
        return [] if value is None else [(value, {})]

    def requests() -> Observations:
        now = figures()
        out: Observations = []
        if now.running is not None:
            out.append((now.running, {sc.LLM_REQUEST_STATE: sc.STATE_RUNNING}))
        if now.waiting is not None:
            out.append((now.waiting, {sc.LLM_REQUEST_STATE: sc.STATE_WAITING}))
        return out

    def prompt_tokens() -> Observations:
        by_source = figures().prompt_tokens
        if by_source is None:
            return []
        return [(n, {sc.LLM_PROMPT_TOKENS_SOURCE: source}) for source, n in by_source.items()]

    def counter(arg: str) -> Callable[[], Observations]:
        def observe() -> Observations:
            total = figures().counters.get(arg)
            return [] if total is None else [(total, {})]

        return observe

    metrics.observe(
        sc.METRIC_KV_CACHE_USAGE,
        sc.UNIT_RATIO,
        "Fraction of KV-cache blocks in use (0..1)",
        usage,
        counter=False,
        gauge=True,
    )
    metrics.observe(
        sc.METRIC_SCHEDULER_REQUESTS,
        sc.UNIT_REQUEST,
        "Requests in the engine's running batch and waiting queue, as the engine counts them",
        requests,
        counter=False,
        gauge=True,
    )
    for arg, name, description in _COUNTERS:
        metrics.observe(name, sc.UNIT_TOKEN, description, counter(arg), counter=True)
    metrics.observe(
        sc.METRIC_PROMPT_TOKENS,
        sc.UNIT_TOKEN,
        "Prompt tokens of requests scheduled for the first time, by source: computed, prefix cache, "
        "KV transfer",
        prompt_tokens,
        counter=True,
    )
