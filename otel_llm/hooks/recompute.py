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

The figures travel in the request's record (``otel_llm.record``, each preemption's cached and recompute
tokens); the emit side's ``otel_llm.emit.recompute`` turns them into span attributes and counters.
"""

from __future__ import annotations

from otel_llm.hooks.timeline import Preemption


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
