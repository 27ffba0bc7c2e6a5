"""What each of vLLM's reschedulings cost in work, against vLLM 0.33's own numbers from the same run.

The engine core runs in the driver's process, so the integration reads what vLLM's scheduler found
cached when it re-admitted a preempted request (``otel_llm.integrations.vllm.rescheduling``) and the
tracker derives what was recomputed from the tokens the frontend delivered. The driver writes down vLLM's
side independently, from its ``Request`` right after ``schedule()``: the tokens found cached
(``num_computed_tokens`` less the step's scheduled tokens), those left to compute (``num_tokens`` less
them), then the tokens the scheduler gave the recompute; and vLLM's own prefix-cache counters for
preempted requests (``SchedulerStats.prefix_cache_stats.preempted_queries`` / ``preempted_hits``) and its
``vllm:prompt_tokens_by_source`` split, as its Prometheus logger adds them up.
"""

from __future__ import annotations

from typing import Any

from otel_llm import semconv as sc
from tests.vllm.conftest import metric, needs_vllm, roots, trace_of, vllm_preemptions

pytestmark = needs_vllm


def reschedulings(run: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return run["vllm_reschedulings"]


def recompute_spans(run: dict[str, Any], root: dict[str, Any]) -> list[dict[str, Any]]:
    spans = [s for s in trace_of(run, root) if s["name"] == sc.SPAN_RECOMPUTE]
    return sorted(spans, key=lambda s: s["start"])


def test_the_scenarios_have_every_kind_of_preemption(vllm_runs: dict[str, dict[str, Any]]) -> None:
    preemptions = [
        p for run in vllm_runs.values() for rid in run["requests"] for p in vllm_preemptions(run, rid)
    ]
    redone = [r for run in vllm_runs.values() for rs in reschedulings(run).values() for r in rs]
    assert any(p.before_first_token for p in preemptions), "a preemption before the first token"
    assert any(not p.before_first_token for p in preemptions), "one after it"
    assert any(len(rs) > 1 for run in vllm_runs.values() for rs in reschedulings(run).values()), "repeated"
    assert any(r["cut_short"] for r in redone), "a recompute cut short by another preemption"
    assert any(r["cached"] > 0 for r in redone), "a rescheduling that found blocks in the prefix cache"
    assert len(redone) == len(preemptions) - sum(p.rescheduled is None for p in preemptions)


def test_each_recompute_span_carries_vllms_own_figures(any_run: dict[str, Any]) -> None:
    for request_id, root in roots(any_run).items():
        expected = reschedulings(any_run).get(request_id, [])
        got = [
            (s["attributes"][sc.LLM_RECOMPUTE_CACHED_TOKENS], s["attributes"][sc.LLM_RECOMPUTE_TOKENS])
            for s in recompute_spans(any_run, root)
        ]
        assert got == [(r["cached"], r["to_compute"]) for r in expected], request_id
        for r in expected:
            # The figure is the work vLLM then scheduled for the recompute, unless it was cut short.
            assert (r["fed"] < r["to_compute"]) if r["cut_short"] else (r["fed"] == r["to_compute"]), r


def test_request_sums_and_counters_equal_vllms_counts(any_run: dict[str, Any]) -> None:
    every = [r for rs in reschedulings(any_run).values() for r in rs]
    for request_id, root in roots(any_run).items():
        expected = reschedulings(any_run).get(request_id, [])
        attrs = root["attributes"]
        if not expected:
            assert sc.LLM_PREEMPTIONS_RECOMPUTE_TOKENS not in attrs
            continue
        assert attrs[sc.LLM_PREEMPTIONS_RECOMPUTE_TOKENS] == sum(r["to_compute"] for r in expected)
        assert attrs[sc.LLM_PREEMPTIONS_RECOMPUTE_CACHED_TOKENS] == sum(r["cached"] for r in expected)
    if not every:
        assert not metric(any_run, sc.METRIC_RECOMPUTE_TOKENS)
        return
    (tokens,) = metric(any_run, sc.METRIC_RECOMPUTE_TOKENS)
    (cached,) = metric(any_run, sc.METRIC_RECOMPUTE_CACHED_TOKENS)
    assert tokens["value"] == sum(r["to_compute"] for r in every)
    assert cached["value"] == sum(r["cached"] for r in every)
    engine = any_run["vllm_engine_state"]
    if any_run["prefix_caching"]:
        # vLLM's own prefix-cache counters of preempted requests' lookups: the context looked up at
        # each re-admission (found cached + left to compute) and the part found.
        assert engine["preempted_prefix_hits"] == cached["value"]
        assert engine["preempted_prefix_queries"] == cached["value"] + tokens["value"]
    else:
        assert cached["value"] == 0 and engine["preempted_prefix_queries"] == 0


def test_prompt_tokens_by_source_equal_vllms(any_run: dict[str, Any]) -> None:
    vllm = any_run["vllm_engine_state"]["prompt_tokens_by_source"]
    ours = {
        p["attributes"][sc.LLM_PROMPT_TOKENS_SOURCE]: p["value"]
        for p in metric(any_run, sc.METRIC_PROMPT_TOKENS)
    }
    assert ours == {
        sc.PROMPT_SOURCE_COMPUTED: vllm["local_compute"],
        sc.PROMPT_SOURCE_PREFIX_CACHE: vllm["local_cache_hit"],
        sc.PROMPT_SOURCE_KV_TRANSFER: vllm["external_kv_transfer"],
    }
