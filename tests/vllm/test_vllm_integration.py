"""otel_llm's vLLM integration against vLLM 0.33.0's real Scheduler and OutputProcessor.

vLLM and its pinned torch live in their own virtualenv (``tests/vllm/make_env.sh`` builds ``.venv-vllm``;
``OTEL_LLM_VLLM_PYTHON`` points at another interpreter, which must have this checkout installed, editable,
because vLLM finds the plugin through the installed entry points). ``drive_scheduler.py`` runs there as a real
subprocess: vLLM's scheduler preempts requests under a tiny KV cache, vLLM's own OutputProcessor
(instrumented by otel_llm) processes every batch, and the driver reports our spans and metrics next to
vLLM's own FinishedRequestStats for the same run. The expected values here are vLLM's numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from otel_llm import semconv as sc

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("drive_scheduler.py")
VLLM_PYTHON = Path(os.environ.get("OTEL_LLM_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
ABS = 1e-6  # seconds: float precision for values computed from the same monotonic timestamps

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.exists(),
    reason=f"vLLM virtualenv not found at {VLLM_PYTHON}: build it with `bash tests/vllm/make_env.sh` "
    "(about 2 GB, a few minutes) or set OTEL_LLM_VLLM_PYTHON",
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("vllm") / "run.json"
    proc = subprocess.run(
        [str(VLLM_PYTHON), str(DRIVER), str(out)],
        cwd=out.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        pytest.fail(f"drive_scheduler.py exited {proc.returncode}; its output is above")
    return json.loads(out.read_text())


def roots(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = [s for s in run["spans"] if s["name"] == sc.SPAN_REQUEST]
    by_id = {s["attributes"][sc.LLM_REQUEST_ID]: s for s in found}
    assert len(by_id) == len(found), "two llm.request spans for one request"
    return by_id


def trace_of(run: dict[str, Any], root: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in run["spans"] if s["trace_id"] == root["trace_id"]]


def vllm_stats(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["request_id"]: f for f in run["vllm"]}


def metric(run: dict[str, Any], name: str, **attributes: Any) -> list[dict[str, Any]]:
    return [
        m
        for m in run["metrics"]
        if m["name"] == name and all(m["attributes"].get(k) == v for k, v in attributes.items())
    ]


def test_the_run_preempted_and_instrumentation_turned_stats_on(run: dict[str, Any]) -> None:
    # The driver builds the Scheduler with log_stats=False; only the instrumentor can have turned it on.
    assert run["scheduler_log_stats"] is True
    assert sum(f["num_preemptions"] for f in run["vllm"]) >= 2
    assert run["anomalies"] == {}, "the adapter fed the tracker something out of order"


def test_instrument_wraps_and_uninstrument_restores_vllm(run: dict[str, Any]) -> None:
    assert run["patched"] == [
        "OutputProcessor.abort_requests",
        "OutputProcessor.add_request",
        "OutputProcessor.process_outputs",
        "Scheduler.__init__",
    ]
    assert run["restored"] is True


def test_vllm_loads_the_general_plugin(tmp_path: Path) -> None:
    # vLLM calls every `vllm.general_plugins` entry point in each of its processes. Run outside the
    # checkout: a build's otel_llm.egg-info in the current folder would shadow the installed metadata.
    code = (
        "from vllm.plugins import load_general_plugins; load_general_plugins(); "
        "from otel_llm.integrations.vllm import VLLMInstrumentor; "
        "print('instrumented:', VLLMInstrumentor().is_instrumented)"
    )
    proc = subprocess.run(
        [str(VLLM_PYTHON), "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "instrumented: True" in proc.stdout


def test_one_trace_per_request(run: dict[str, Any]) -> None:
    by_id = roots(run)
    assert set(by_id) == set(run["requests"])
    assert len({r["trace_id"] for r in by_id.values()}) == len(by_id)
    root_traces = {r["trace_id"] for r in by_id.values()}
    assert {s["trace_id"] for s in run["spans"]} == root_traces


def test_trace_headers_are_the_parent(run: dict[str, Any]) -> None:
    parented = [r for r in roots(run).values() if r["trace_id"] == run["parent_trace_id"]]
    assert len(parented) == 1
    assert parented[0]["parent_id"] is not None
    others = [r for r in roots(run).values() if r is not parented[0]]
    assert all(r["parent_id"] is None for r in others)


def test_preemption_spans_where_vllm_preempted(run: dict[str, Any]) -> None:
    stats = vllm_stats(run)
    for request_id, root in roots(run).items():
        spans = trace_of(run, root)
        preempted = [s for s in spans if s["name"] == sc.SPAN_PREEMPTED]
        recompute = [s for s in spans if s["name"] == sc.SPAN_RECOMPUTE]
        expected = run["vllm_preempted_events"][request_id]
        if request_id in stats:
            assert stats[request_id]["num_preemptions"] == expected
        assert len(preempted) == expected, request_id
        assert len(recompute) == expected, request_id  # every preempted request here produced again
        assert root["attributes"][sc.LLM_PREEMPTIONS] == expected
        phases = {s["span_id"]: s for s in spans if s["name"] in (sc.SPAN_PREFILL, sc.SPAN_DECODE)}
        for span in preempted + recompute:
            phase = phases[span["parent_id"]]
            assert phase["start"] <= span["start"] <= span["end"] <= phase["end"]
        for before, after in zip(
            sorted(preempted, key=lambda s: s["start"]), sorted(recompute, key=lambda s: s["start"])
        ):
            assert before["end"] == after["start"]  # evicted until rescheduled, then recomputing


@pytest.mark.parametrize(
    ("attribute", "field"),
    [
        (sc.LLM_LATENCY_QUEUE, "queued_time"),
        (sc.LLM_LATENCY_PREFILL, "prefill_time"),
        (sc.LLM_LATENCY_DECODE, "decode_time"),
        (sc.LLM_LATENCY_INFERENCE, "inference_time"),
    ],
)
def test_latencies_equal_vllm_finished_request_stats(run: dict[str, Any], attribute: str, field: str) -> None:
    by_id = roots(run)
    stats = vllm_stats(run)
    assert set(stats) == set(run["requests"]) - {run["aborted"]}
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
def test_histograms_equal_vllm(run: dict[str, Any], name: str, field: str) -> None:
    (point,) = metric(run, name)
    assert point["count"] == len(run["vllm"])  # the aborted request was never scheduled
    assert point["sum"] == pytest.approx(sum(f[field] for f in run["vllm"]), abs=ABS)


def test_inter_token_latency_equals_vllm(run: dict[str, Any]) -> None:
    (point,) = metric(run, sc.METRIC_ITL)
    assert point["count"] == len(run["vllm_inter_token_latencies"])
    assert point["sum"] == pytest.approx(sum(run["vllm_inter_token_latencies"]), abs=ABS)


def test_preemption_counter_equals_vllm(run: dict[str, Any]) -> None:
    (point,) = metric(run, sc.METRIC_PREEMPTIONS)
    assert point["value"] == sum(run["vllm_preempted_events"].values())


def test_finish_reasons_and_token_counts(run: dict[str, Any]) -> None:
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
    for vllm in run["vllm"]:
        attributes = by_id[vllm["request_id"]]["attributes"]
        assert attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == vllm["num_generation_tokens"]
        assert attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == vllm["num_prompt_tokens"]
