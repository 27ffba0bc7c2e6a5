"""otel_llm's vLLM integration against vLLM's real Scheduler and OutputProcessor, on each release of the
scheduler tier (the tested range's two ends; ``conftest.py``).

``drive_scheduler.py`` (run once per session by ``conftest.py``, in vLLM's own virtualenv) drives vLLM's
scheduler through several scenarios; vLLM's own OutputProcessor (instrumented by otel_llm) processes
every batch, and the driver reports our spans and metrics next to vLLM's own FinishedRequestStats for the
same run. The expected values here are vLLM's numbers. Tests taking ``any_run`` run for every scenario;
those taking ``run`` look at the ``mixed`` scenario (abort, stop, length, a W3C parent).
"""

from __future__ import annotations

import itertools
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from otel_llm import semconv as sc
from tests.vllm.conftest import (
    ABS,
    SCENARIOS,
    metric,
    needs_vllm,
    roots,
    seconds,
    trace_of,
    vllm_preemptions,
    vllm_stats,
)

pytestmark = needs_vllm


@pytest.fixture
def run(vllm_runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return vllm_runs["mixed"]


def test_every_scenario_ran(vllm_runs: dict[str, dict[str, Any]]) -> None:
    assert set(vllm_runs) == set(SCENARIOS)


def test_the_run_preempted_and_instrumentation_turned_stats_on(any_run: dict[str, Any]) -> None:
    # The driver builds the Scheduler with log_stats=False; only the instrumentor can have turned it on.
    assert any_run["scheduler_log_stats"] is True
    assert any_run["anomalies"] == {}, "the adapter fed the tracker something out of order"


def test_mixed_run_preempted_after_first_tokens(run: dict[str, Any]) -> None:
    preemptions = [p for rid in run["requests"] for p in vllm_preemptions(run, rid)]
    assert len(preemptions) >= 2
    assert not any(p.before_first_token for p in preemptions)  # prefill_preemption covers those


def test_instrument_wraps_and_uninstrument_restores_vllm(any_run: dict[str, Any]) -> None:
    assert any_run["patched"] == [
        "OutputProcessor.abort_requests",
        "OutputProcessor.add_request",
        "OutputProcessor.process_outputs",
        "OutputProcessor.update_scheduler_stats",
        "Scheduler.__init__",
        "Scheduler.schedule",
    ]
    assert any_run["restored"] is True


def test_vllm_loads_the_general_plugin(vllm_python: Path, tmp_path: Path) -> None:
    # vLLM calls every `vllm.general_plugins` entry point in each of its processes. Run outside the
    # checkout: a build's otel_llm.egg-info in the current folder would shadow the installed metadata.
    code = (
        "from vllm.plugins import load_general_plugins; load_general_plugins(); "
        "from otel_llm.integrations.vllm import VLLMInstrumentor; "
        "print('instrumented:', VLLMInstrumentor().is_instrumented)"
    )
    proc = subprocess.run(
        [str(vllm_python), "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "instrumented: True" in proc.stdout
    assert "outside the releases otel-llm is tested on" not in proc.stderr  # a release of the range


def test_the_run_is_on_the_vllm_release_it_is_named_after(vllm_release: str, run: dict[str, Any]) -> None:
    if vllm_release != "given":  # OTEL_LLM_VLLM_PYTHON: whatever that interpreter has
        assert run["vllm_version"] == vllm_release


def test_the_engine_core_got_the_prompt_ids_as_vllms_frontend_sends_them(any_run: dict[str, Any]) -> None:
    """Every request reached vLLM's scheduler through vLLM's own frontend-to-engine-core encoding: as an
    int32 NumPy array, wrapped by the engine core in a TokenBuffer, where vLLM's client packs prompt ids
    (0.34 and later), else as a list; the whole tier's figures are taken on that path."""
    received = any_run["engine_core_received"]
    assert {rid: r["count"] for rid, r in received["requests"].items()} == {
        rid: spec["prompt_len"] for rid, spec in any_run["requests"].items()
    }
    if received["packs_prompt"]:
        assert {r["type"] for r in received["requests"].values()} == {"ndarray"}
        assert any_run["engine_core_prompt_types"] == ["TokenBuffer"]
    else:
        assert {r["type"] for r in received["requests"].values()} == {"list"}
    # A guard on the detection itself: vLLM's client packs prompt ids from 0.34 on (0.30 to 0.33 send
    # the list), so a run on 0.34 or later that did not take the NumPy path has missed it.
    assert received["packs_prompt"] == (Version(any_run["vllm_version"]).release >= (0, 34))


def test_one_trace_per_request(any_run: dict[str, Any]) -> None:
    by_id = roots(any_run)
    assert set(by_id) == set(any_run["requests"])
    assert len({r["trace_id"] for r in by_id.values()}) == len(by_id)
    root_traces = {r["trace_id"] for r in by_id.values()}
    assert {s["trace_id"] for s in any_run["spans"]} == root_traces


def test_trace_headers_are_the_parent(run: dict[str, Any]) -> None:
    parented = [r for r in roots(run).values() if r["trace_id"] == run["parent_trace_id"]]
    assert len(parented) == 1
    assert parented[0]["parent_id"] is not None
    others = [r for r in roots(run).values() if r is not parented[0]]
    assert all(r["parent_id"] is None for r in others)


def test_preemption_spans_where_vllm_preempted(any_run: dict[str, Any]) -> None:
    """Each of vLLM's preemptions is one llm.preempted [P, R] and one llm.recompute [R, T] span, under
    llm.prefill when P came before the first token, else under llm.decode; durations are vLLM's."""
    stats = vllm_stats(any_run)
    for request_id, root in roots(any_run).items():
        spans = trace_of(any_run, root)
        expected = vllm_preemptions(any_run, request_id)
        if request_id in stats:
            assert stats[request_id]["num_preemptions"] == len(expected)
        assert root["attributes"][sc.LLM_PREEMPTIONS] == len(expected)
        preempted = sorted((s for s in spans if s["name"] == sc.SPAN_PREEMPTED), key=lambda s: s["start"])
        recompute = sorted((s for s in spans if s["name"] == sc.SPAN_RECOMPUTE), key=lambda s: s["start"])
        assert len(preempted) == len(recompute) == len(expected), request_id  # every one produced again
        phases = {s["span_id"]: s for s in spans if s["name"] in (sc.SPAN_PREFILL, sc.SPAN_DECODE)}
        for vllm, waited, redone in zip(expected, preempted, recompute):
            phase = sc.SPAN_PREFILL if vllm.before_first_token else sc.SPAN_DECODE
            for span in (waited, redone):
                parent = phases[span["parent_id"]]
                assert parent["name"] == phase, (request_id, span["name"])
                assert parent["start"] <= span["start"] <= span["end"] <= parent["end"]
            assert waited["end"] == redone["start"]  # evicted until rescheduled, then recomputing
            assert seconds(waited) == pytest.approx(vllm.rescheduled - vllm.preempted, abs=ABS)
            assert seconds(redone) == pytest.approx(vllm.recompute_end - vllm.rescheduled, abs=ABS)


@pytest.mark.parametrize(
    ("attribute", "field"),
    [
        (sc.LLM_LATENCY_QUEUE, "queued_time"),
        (sc.LLM_LATENCY_PREFILL, "prefill_time"),
        (sc.LLM_LATENCY_DECODE, "decode_time"),
        (sc.LLM_LATENCY_INFERENCE, "inference_time"),
    ],
)
def test_latencies_equal_vllm_finished_request_stats(
    any_run: dict[str, Any], attribute: str, field: str
) -> None:
    by_id = roots(any_run)
    stats = vllm_stats(any_run)
    assert set(stats) == set(any_run["requests"]) - {any_run["aborted"]}
    for request_id, vllm in stats.items():
        assert by_id[request_id]["attributes"][attribute] == pytest.approx(vllm[field], abs=ABS), request_id


@pytest.mark.parametrize(
    ("name", "field"),
    [
        (sc.METRIC_QUEUE, "queued_time"),
        (sc.METRIC_PREFILL, "prefill_time"),
        (sc.METRIC_DECODE, "decode_time"),
        (sc.METRIC_INFERENCE, "inference_time"),
    ],
)
def test_histograms_equal_vllm(any_run: dict[str, Any], name: str, field: str) -> None:
    (point,) = metric(any_run, name)
    assert point["count"] == len(any_run["vllm"])  # an aborted request was never scheduled
    assert point["sum"] == pytest.approx(sum(f[field] for f in any_run["vllm"]), abs=ABS)


def test_inter_token_latency_equals_vllm(any_run: dict[str, Any]) -> None:
    (point,) = metric(any_run, sc.METRIC_ITL)
    assert point["count"] == len(any_run["vllm_inter_token_latencies"])
    assert point["sum"] == pytest.approx(sum(any_run["vllm_inter_token_latencies"]), abs=ABS)


def test_preemption_counter_equals_vllm(any_run: dict[str, Any]) -> None:
    points = metric(any_run, sc.METRIC_PREEMPTIONS)
    total = sum(f["num_preemptions"] for f in any_run["vllm"])
    assert total == sum(any_run["vllm_preempted_events"].values())
    assert sum(p["value"] for p in points) == total


def test_token_counts_equal_vllm(any_run: dict[str, Any]) -> None:
    by_id = roots(any_run)
    for vllm in any_run["vllm"]:
        attributes = by_id[vllm["request_id"]]["attributes"]
        assert attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == vllm["num_generation_tokens"]
        assert attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == vllm["num_prompt_tokens"]
    (output,) = metric(any_run, sc.METRIC_TOKENS, **{sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_TYPE_OUTPUT})
    assert output["value"] == sum(f["num_generation_tokens"] for f in any_run["vllm"])


def test_finish_reasons(run: dict[str, Any]) -> None:
    by_id = roots(run)
    expected_reasons = {f["request_id"]: f["finish_reason"].lower() for f in run["vllm"]}
    expected_reasons[run["aborted"]] = sc.REASON_ABORT
    counted: dict[str, int] = defaultdict(int)
    for request_id, reason in expected_reasons.items():
        attributes = by_id[request_id]["attributes"]
        assert attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == [reason]
        assert by_id[request_id]["status"] == "UNSET"  # neither stop, length nor abort is a failure
        counted[reason] += 1
    assert {sc.REASON_STOP, sc.REASON_LENGTH, sc.REASON_ABORT} <= set(counted)
    for reason, count in counted.items():
        (point,) = metric(run, sc.METRIC_REQUESTS, **{sc.LLM_FINISH_REASON: reason})
        assert point["value"] == count


def test_engine_state_equals_vllms_scheduler_stats(any_run: dict[str, Any]) -> None:
    """The engine-state metrics against vLLM's own SchedulerStats and IterationStats of the same steps
    (the driver sums those; its gauges are the last step's, taken after the requests drained)."""
    vllm = any_run["vllm_engine_state"]
    assert vllm["stats_steps"] == any_run["steps"]  # the instrumentor turned stats on: one per step
    (step,) = metric(any_run, sc.METRIC_STEP_TOKENS)
    assert step["count"] == len(vllm["iteration_tokens"]) > 0
    assert step["sum"] == sum(vllm["iteration_tokens"])
    (usage,) = metric(any_run, sc.METRIC_KV_CACHE_USAGE)
    assert usage["value"] == pytest.approx(vllm["kv_cache_usage"], abs=1e-12)
    assert vllm["max_kv_cache_usage"] > 0  # the run did use the cache (the last value may be 0)
    for state in (sc.STATE_RUNNING, sc.STATE_WAITING):
        (point,) = metric(any_run, sc.METRIC_SCHEDULER_REQUESTS, **{sc.LLM_REQUEST_STATE: state})
        assert point["value"] == vllm[state]
    for name, field in (
        (sc.METRIC_PREFIX_CACHE_QUERIES, "prefix_cache_queries"),
        (sc.METRIC_PREFIX_CACHE_HITS, "prefix_cache_hits"),
    ):
        if any_run["prefix_caching"]:  # the recompute scenario's: vLLM's own counts
            (point,) = metric(any_run, name)
            assert point["value"] == vllm[field] > 0
        else:  # prefix caching off (the engine tier has real hits): nothing to report
            assert vllm[field] == 0 and metric(any_run, name) == []


def test_speculative_decoding_counts_equal_vllm(vllm_runs: dict[str, dict[str, Any]]) -> None:
    run = vllm_runs["speculative"]
    vllm = run["vllm_engine_state"]
    assert vllm["spec_draft_tokens"] > vllm["spec_accepted_tokens"] > 0  # s1 accepts one of two drafts
    (drafted,) = metric(run, sc.METRIC_SPEC_DRAFT_TOKENS)
    (accepted,) = metric(run, sc.METRIC_SPEC_ACCEPTED_TOKENS)
    assert drafted["value"] == vllm["spec_draft_tokens"]
    assert accepted["value"] == vllm["spec_accepted_tokens"]


def test_a_steady_decode_batch_takes_the_trackers_steady_path(vllm_runs: dict[str, dict[str, Any]]) -> None:
    # Six requests decode side by side for 31 steps after their first token: each step whose outputs
    # are the previous step's requests again must reach the tracker as that same batch, without counts,
    # and move its one shared step (the adapter's plain-step path feeding the tracker's steady path).
    calls = vllm_runs["steady"]["tokens_calls"]
    repeats = [call for before, call in itertools.pairwise(calls) if call["ids"] == before["ids"]]
    assert len(repeats) >= 25, calls
    assert [call for call in repeats if call["counts"] or not call["steady"]] == []
    # Not every call is steady: the first step of a batch starts a step of its own.
    assert not calls[0]["steady"]
