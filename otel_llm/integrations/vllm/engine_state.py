"""vLLM's numbers about its own engine, read for ``RequestTracker.engine_state()``.

vLLM's engine core builds one ``SchedulerStats`` per engine step when stats logging is on (the
instrumentor turns it on in ``Scheduler.__init__``) and sends it to the frontend with that step's
``EngineCoreOutputs``; the frontend hands it to ``OutputProcessor.update_scheduler_stats`` once per step,
after the step's outputs went through ``process_outputs``. Everything is read by attribute name (no vLLM
import), and a value that is missing or not a plain number is left out rather than passed on: the
tracker would raise on it, and telemetry trouble must not reach vLLM.

What each ``engine_state()`` argument is read from, and vLLM's own metric of the same number:

- ``kv_cache_usage``: ``kv_cache_usage``, fraction of KV blocks in use (``vllm:kv_cache_usage_perc``);
- ``running``: ``num_running_reqs`` (``vllm:num_requests_running``);
- ``waiting``: ``num_waiting_reqs`` + ``num_skipped_waiting_reqs`` (``vllm:num_requests_waiting``);
- ``prefix_cache_queries`` / ``prefix_cache_hits``: ``prefix_cache_stats.queries`` / ``.hits``, prompt
  tokens (``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``);
- ``spec_drafted_tokens`` / ``spec_accepted_tokens``: ``spec_decoding_stats.num_draft_tokens`` /
  ``.num_accepted_tokens`` (``vllm:spec_decode_num_draft_tokens`` / ``..._num_accepted_tokens``);
- ``step_tokens`` (counted by the adapter from the step's outputs): new tokens plus, on a request's
  first output, ``prefill_stats.num_computed_tokens`` (``vllm:iteration_tokens_total``);
- ``prompt_tokens_computed`` / ``_cached`` / ``_transferred`` (summed by the adapter over the step's
  first outputs): ``prefill_stats.num_computed_tokens`` / ``.num_local_cached_tokens`` /
  ``.num_external_cached_tokens`` (``vllm:prompt_tokens_by_source``, sources ``local_compute``,
  ``local_cache_hit``, ``external_kv_transfer``).
"""

from __future__ import annotations

import math
from typing import Any


def whole(value: Any) -> int | None:
    """``value`` when it is a non-negative int (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def fraction(value: Any) -> float | None:
    """``value`` as a float when it is a finite number in [0, 1], else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def state_of(stats: Any) -> dict[str, Any]:
    """``engine_state()`` keyword arguments from one vLLM ``SchedulerStats`` (those it carries).

    Counters are vLLM's increments for the step: its engine core hands out a fresh ``PrefixCacheStats``
    (and ``SpecDecodingStats``) with every ``SchedulerStats``. A ``PrefixCacheStats`` whose ``reset``
    flag is set (someone called ``reset_prefix_cache``) still counts lookups that happened: the flag
    only tells vLLM's windowed hit-rate log to start over, so its queries and hits are added like any
    other (vLLM's own Prometheus counters do the same). Preempted requests' repeated lookups
    (``preempted_queries``) and an external KV connector's cache (``connector_prefix_cache_stats``) are
    left out, as in ``vllm:prefix_cache_queries``.
    """
    state: dict[str, Any] = {}
    usage = fraction(getattr(stats, "kv_cache_usage", None))
    if usage is not None:
        state["kv_cache_usage"] = usage
    running = whole(getattr(stats, "num_running_reqs", None))
    if running is not None:
        state["running"] = running
    waiting = whole(getattr(stats, "num_waiting_reqs", None))
    if waiting is not None:
        # Requests vLLM deferred (blocked on a transient constraint) wait too; vLLM's gauge adds them.
        waiting += whole(getattr(stats, "num_skipped_waiting_reqs", 0)) or 0
        state["waiting"] = waiting
    prefix = getattr(stats, "prefix_cache_stats", None)
    if prefix is not None:
        queries = whole(getattr(prefix, "queries", None))
        hits = whole(getattr(prefix, "hits", None))
        if queries and hits is not None and hits <= queries:
            state["prefix_cache_queries"] = queries
            state["prefix_cache_hits"] = hits
    spec = getattr(stats, "spec_decoding_stats", None)
    if spec is not None:
        drafted = whole(getattr(spec, "num_draft_tokens", None))
        accepted = whole(getattr(spec, "num_accepted_tokens", None))
        if drafted and accepted is not None and accepted <= drafted:
            state["spec_drafted_tokens"] = drafted
            state["spec_accepted_tokens"] = accepted
    return state


def computed_prompt_tokens(output: Any) -> int | None:
    """Prompt tokens the engine computed (not found cached) for a request, from its first output.

    vLLM attaches ``prefill_stats`` to a request's first output only. None when this output has none.
    """
    prefill = getattr(output, "prefill_stats", None)
    if prefill is None:
        return None
    return whole(getattr(prefill, "num_computed_tokens", None))


def cached_prompt_tokens(output: Any) -> int | None:
    """Prompt tokens found in the prefix cache at the request's first scheduling, from its first output.

    vLLM 0.32 and 0.33 put them in ``prefill_stats.num_cached_tokens``; earlier V1 releases had
    ``num_cached_tokens`` on every output itself (the tracker keeps the figure of the first scheduling).
    """
    prefill = getattr(output, "prefill_stats", None)
    if prefill is not None:
        return whole(getattr(prefill, "num_cached_tokens", None))
    return whole(getattr(output, "num_cached_tokens", None))


def prompt_sources(output: Any) -> tuple[int, int, int] | None:
    """(computed, local prefix cache, external KV transfer) prompt tokens of a request, from its first
    output's ``prefill_stats``, as vLLM splits ``vllm:prompt_tokens_by_source``. None when this output
    has none, or a vLLM without the split (then the prompt tokens by source are not reported)."""
    prefill = getattr(output, "prefill_stats", None)
    if prefill is None:
        return None
    split = (
        whole(getattr(prefill, "num_computed_tokens", None)),
        whole(getattr(prefill, "num_local_cached_tokens", None)),
        whole(getattr(prefill, "num_external_cached_tokens", None)),
    )
    if None in split:
        return None
    return split  # type: ignore[return-value]
