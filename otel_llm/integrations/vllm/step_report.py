"""One vLLM engine step's ``engine_state()`` call, from its ``SchedulerStats`` and its outputs' tokens.

The adapter counts each step's tokens as its outputs arrive (vLLM's ``vllm:iteration_tokens_total``) and
sums the prompt tokens of the step's first outputs by source; at the step's end it hands them here with
the step's ``SchedulerStats``, which ``engine_state`` reads field by field. The common decode step takes a
shorter path: it reads five fields straight.
"""

from __future__ import annotations

from typing import Any

from otel_llm.integrations.vllm.engine_state import state_of


def add_prompt(step: list[int] | None, sources: tuple[int, int, int]) -> list[int]:
    """The step's prompt tokens by source (computed, local cache, external: vLLM's split) with those of
    one request's first output added; ``step`` None: the step's first."""
    if step is None:
        return list(sources)
    for k, n in enumerate(sources):
        step[k] += n
    return step


def report_step(tracker: Any, stats: Any, step_tokens: int | None, prompt: list[int] | None) -> None:
    """One ``tracker.engine_state()`` call for one engine step, or none when there is nothing to say.

    ``stats``: vLLM's ``SchedulerStats`` (None: the engine core sent none this step); ``step_tokens``:
    the tokens its outputs delivered (None: not known); ``prompt``: the prompt tokens its first outputs
    computed, found in the local cache and transferred from elsewhere (vLLM's split), or None. A step of
    vLLM 0.32 / 0.33 with no first output, no prefix-cache lookup and no speculative decoding reads five
    fields straight; any other goes through ``state_of``, field by field.
    """
    if prompt is None and stats is not None:
        try:
            usage, running = stats.kv_cache_usage, stats.num_running_reqs
            waiting, deferred = stats.num_waiting_reqs, stats.num_skipped_waiting_reqs
            prefix, spec = stats.prefix_cache_stats, stats.spec_decoding_stats
        except AttributeError:  # another vLLM's SchedulerStats: the checked path below
            pass
        else:
            if (
                usage.__class__ is float
                and 0.0 <= usage <= 1.0
                and running.__class__ is int
                and waiting.__class__ is int
                and deferred.__class__ is int
                and running >= 0
                and waiting >= 0
                and deferred >= 0
                and spec is None
                and (prefix is None or not prefix.queries)
            ):
                tracker.engine_state(
                    kv_cache_usage=usage, running=running, waiting=waiting + deferred, step_tokens=step_tokens
                )
                return
    state = state_of(stats) if stats is not None else {}
    if step_tokens is not None:
        state["step_tokens"] = step_tokens
    if prompt is not None:
        computed, cached, transferred = prompt
        state["prompt_tokens_computed"] = computed
        state["prompt_tokens_cached"] = cached
        state["prompt_tokens_transferred"] = transferred
    if state:
        tracker.engine_state(**state)
