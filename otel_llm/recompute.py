"""What a preemption cost in work: the tokens the engine computed again when it rescheduled a preempted
request, and the tokens of that request it found in its prefix cache then.

An engine reports its prefix-cache hits at a rescheduling (R_k) as it does at the first scheduling:
``scheduled(ids, cached_tokens=[...])``. A recompute rebuilds the request's whole context, its prompt
and the output tokens it produced before the preemption (P_k), so

    recompute tokens = prompt tokens + output tokens at P_k - cached tokens

which is the reference engine's and vLLM's ``num_tokens - num_computed_tokens`` right after they
rescheduled the request. Every count here is in tokens. The figure is what the rescheduling set out to
compute: a recompute cut short by another preemption keeps it, and the next rescheduling counts its own
context again (the work lost twice is counted twice, as the engine pays it twice).

Spans: ``llm.recompute`` carries the figures of its preemption, ``llm.request`` their sums over all of
its preemptions (also those past the span cap). Metrics: two counters, added to when the request ends,
from the same figures, so over the requests that ended they equal the sums on their spans.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from otel_llm import semconv as sc
from otel_llm.timeline import Preemption


def reschedule(p: Preemption, prompt_tokens: int | None, output_tokens: int, cached: int) -> bool:
    """Record on ``p`` what its rescheduling cost: ``cached`` tokens found in the prefix cache, and the
    rest of the context (``prompt_tokens`` + ``output_tokens`` before P_k) to compute. Without the
    prompt's length only the cached figure is known. Returns False when the engine reported more cached
    tokens than the context holds (its count and ours disagree); the recompute is then taken as 0."""
    p.cached_tokens = cached
    if prompt_tokens is None:
        return True
    context = prompt_tokens + output_tokens
    p.recompute_tokens = context - cached if cached <= context else 0
    return cached <= context


def span_attributes(p: Preemption) -> dict[str, int] | None:
    """The attributes of the preemption's ``llm.recompute`` span (None when nothing was reported)."""
    if p.cached_tokens is None:
        return None
    if p.recompute_tokens is None:
        return {sc.LLM_RECOMPUTE_CACHED_TOKENS: p.cached_tokens}
    return {sc.LLM_RECOMPUTE_TOKENS: p.recompute_tokens, sc.LLM_RECOMPUTE_CACHED_TOKENS: p.cached_tokens}


def totals(preemptions: Iterable[Preemption]) -> tuple[int | None, int | None]:
    """(recompute tokens, cached tokens) summed over the preemptions that reported them; None for a
    figure no preemption reported."""
    recompute = cached = None
    for p in preemptions:
        if p.cached_tokens is not None:
            cached = (cached or 0) + p.cached_tokens
        if p.recompute_tokens is not None:
            recompute = (recompute or 0) + p.recompute_tokens
    return recompute, cached


def request_attributes(preemptions: list[Preemption]) -> dict[str, int]:
    """The sums on ``llm.request``: ``llm.preemptions.recompute.tokens`` / ``.cached_tokens``."""
    recompute, cached = totals(preemptions)
    attrs: dict[str, int] = {}
    if recompute is not None:
        attrs[sc.LLM_PREEMPTIONS_RECOMPUTE_TOKENS] = recompute
    if cached is not None:
        attrs[sc.LLM_PREEMPTIONS_RECOMPUTE_CACHED_TOKENS] = cached
    return attrs


class RecomputeCounters:
    """``llm.server.recompute.tokens`` and ``llm.server.recompute.cached_tokens`` of one tracker.

    Plain ints added to when a request ends (under the metrics' lock), read by observable counters at
    collection time; each is exported from the first figure reported on (a figure of 0 included)."""

    def __init__(self, observe: Callable[..., None]) -> None:
        """``observe``: ``RequestMetrics.observe`` (name, unit, description, callback, counter=...)."""
        self.tokens: int | None = None
        self.cached_tokens: int | None = None
        observe(
            sc.METRIC_RECOMPUTE_TOKENS,
            sc.UNIT_TOKEN,
            "Tokens recomputed after preemptions: prompt + output tokens so far - cached, per rescheduling",
            lambda: [] if self.tokens is None else [(self.tokens, {})],
            counter=True,
        )
        observe(
            sc.METRIC_RECOMPUTE_CACHED_TOKENS,
            sc.UNIT_TOKEN,
            "Tokens a preempted request found in the prefix cache when rescheduled (not recomputed)",
            lambda: [] if self.cached_tokens is None else [(self.cached_tokens, {})],
            counter=True,
        )

    def add(self, preemptions: list[Preemption]) -> None:
        """Count one ended request's preemptions. Caller holds the metrics' lock."""
        recompute, cached = totals(preemptions)
        if recompute is not None:
            self.tokens = (self.tokens or 0) + recompute
        if cached is not None:
            self.cached_tokens = (self.cached_tokens or 0) + cached
