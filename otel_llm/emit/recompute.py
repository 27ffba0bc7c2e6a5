"""What a preemption cost in work, as the trace and the metrics show it: each rescheduling's recomputed
and cached tokens (``otel_llm.hooks.recompute`` derives them on the hook side; the record carries them).

Spans: ``llm.recompute`` carries the figures of its preemption, ``llm.request`` their sums over all of
its preemptions (also those past the span cap). Metrics: two counters, added to when the request ends,
from the same figures, so over the requests that ended they equal the sums on their spans. Every count
is in tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from otel_llm import semconv as sc
from otel_llm.record import PREEMPTION_CACHED_TOKENS as _CACHED
from otel_llm.record import PREEMPTION_RECOMPUTE_TOKENS as _RECOMPUTE
from otel_llm.record import Preemption


def span_attributes(p: Preemption) -> dict[str, int] | None:
    """The attributes of the preemption's ``llm.recompute`` span (None when nothing was reported)."""
    cached, recompute = p[_CACHED], p[_RECOMPUTE]
    if cached is None:
        return None
    if recompute is None:
        return {sc.LLM_RECOMPUTE_CACHED_TOKENS: cached}
    return {sc.LLM_RECOMPUTE_TOKENS: recompute, sc.LLM_RECOMPUTE_CACHED_TOKENS: cached}


def totals(preemptions: Iterable[Preemption]) -> tuple[int | None, int | None]:
    """(recompute tokens, cached tokens) summed over the preemptions that reported them; None for a
    figure no preemption reported."""
    recompute = cached = None
    for p in preemptions:
        if p[_CACHED] is not None:
            cached = (cached or 0) + p[_CACHED]
        if p[_RECOMPUTE] is not None:
            recompute = (recompute or 0) + p[_RECOMPUTE]
    return recompute, cached


def request_attributes(preemptions: Iterable[Preemption]) -> dict[str, int]:
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

    def add(self, preemptions: Iterable[Preemption]) -> None:
        """Count one ended request's preemptions. Caller holds the metrics' lock."""
        recompute, cached = totals(preemptions)
        if recompute is not None:
            self.tokens = (self.tokens or 0) + recompute
        if cached is not None:
            self.cached_tokens = (self.cached_tokens or 0) + cached
