"""otel_llm on the real SGLang engine, offline (``sglang.Engine``), compared with SGLang's own numbers, on
each release of the tier (the tested range's two ends; ``conftest.py``).

One driver run (drive_engine.py) per session serves every test here; each scenario has its own engine.
SGLang's values come from its per-request ``meta_info`` (built from SchedulerReqTimeStats with metrics
on); ours from the spans and metrics a real OTLP receiver decoded. Test stand-ins in the SGLang
virtualenv: ``sgl_kernel`` and the torchvision operator schemas (see conftest.py); everything else is
SGLang's own code.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cost_model import shares

from otel_llm import semconv as sc
from tests.sglang.conftest import (
    HERE,
    SCENARIOS,
    SGLANG_PYTHON,
    children,
    metric_points,
    needs_sglang,
    roots,
    seconds,
    sglang_env,
)

pytestmark = needs_sglang

ABS = 1e-6  # seconds: float precision of values computed from the same perf_counter stamps


def by_request(run: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    ours = roots(run)
    return [(meta, ours[meta["id"]]) for meta in run["meta"]]


def test_every_request_has_one_trace(run: dict[str, Any]) -> None:
    assert run["arrived"], "not every llm.request span reached the receiver within 30 s"
    assert set(roots(run)) == {m["id"] for m in run["meta"]}


def test_preemptions_equal_sglang_retractions(run: dict[str, Any]) -> None:
    for meta, root in by_request(run):
        assert root["attributes"][sc.LLM_PREEMPTIONS] == meta["num_retractions"], meta["id"]
        assert len(children_named(run, root, sc.SPAN_PREEMPTED)) == meta["num_retractions"]


def children_named(run: dict[str, Any], root: dict[str, Any], name: str) -> list[dict[str, Any]]:
    phases = children(run, root)
    return [s for phase in phases for s in children(run, phase, name)]


def test_the_tracker_hears_every_batch_sglang_ran(run: dict[str, Any]) -> None:
    """Every batch SGLang launched that computes tokens reached the tracker's ``batch()``, in launch
    order, with the tokens SGLang's batch held per request before its forward (under the overlap
    scheduler too, where a batch is reported when its result is processed); so every request says how
    long it stalled (``llm.stalls``, 0 or more)."""
    launched = [b["scheduled"] for b in run["batches"] if b["scheduled"]]
    assert launched, "the driver saw no batch"
    assert {b["mode"] for b in run["batches"]} >= {"EXTEND", "DECODE"}
    assert run["batch_calls"] == launched
    assert all(sc.LLM_STALLS in root["attributes"] for root in roots(run).values())


def test_each_requests_engine_time_is_its_share_of_sglangs_batches(run: dict[str, Any]) -> None:
    """``llm.engine.time`` under the cost model (docs/lifecycle.md, "Engine time"), from SGLang's side
    alone: each batch's tokens per request as SGLang's batch held them, from its launch to the first
    stream of its result (both stamped by the driver, a few µs from where otel_llm stamps them), less
    what overlaps the batch before (the overlap scheduler launches one while another runs); a batch
    whose result streamed nothing ends where the next is launched.

    Per request within 10 %, not exactly. Around SGLang's retractions the request preempted five
    times comes out 2 % high here, 7 % on a busy machine, and the others about 1 % low: a share of
    some step goes to it that the driver's stamps give the others. The cause is not found yet (a
    step's membership taken from the batch itself does not remove it). The sum over requests is exact
    to 1 %."""
    batches = [b for b in run["batches"] if b["scheduled"]]
    expected, _, busy = shares([(b["scheduled"], b["at"], b["streamed_at"], ()) for b in batches])
    got = {rid: root["attributes"][sc.LLM_ENGINE_TIME] for rid, root in roots(run).items()}
    assert set(got) == set(expected)
    for rid, spent in got.items():
        assert spent == pytest.approx(expected[rid], rel=0.10), rid
    assert sum(got.values()) == pytest.approx(busy, rel=0.01)


def test_each_run_exported_in_its_export_mode(engine_runs: dict[str, dict[str, Any]]) -> None:
    """The default mode runs an export process under SGLang's scheduler process; in_process none."""
    assert engine_runs["forced"]["export_processes"] >= 1
    assert engine_runs["natural"]["export_processes"] >= 1
    assert engine_runs["forced_in_process"]["export_processes"] == 0


def test_runs_retract(engine_runs: dict[str, dict[str, Any]]) -> None:
    # Both scenarios exist to exercise retraction; without one the comparisons above prove little.
    for name in SCENARIOS:
        run = engine_runs[name]
        assert sum(m["num_retractions"] for m in run["meta"]) > 0, f"{name}: SGLang retracted nothing"


def test_token_counts_equal_sglang(run: dict[str, Any]) -> None:
    for meta, root in by_request(run):
        attrs = root["attributes"]
        assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == meta["prompt_tokens"], meta["id"]
        assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == meta["completion_tokens"], meta["id"]
        assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == [meta["finish_reason"]["type"]]


def test_queue_and_retraction_waits_equal_sglang_queue_time(run: dict[str, Any]) -> None:
    # SGLang's meta_info queue_time sums every wait in its queue, the first one and one after each
    # retraction. Ours splits the same stamps: llm.queue (first wait) + llm.preempted (each later one).
    for meta, root in by_request(run):
        waits = root["attributes"][sc.LLM_LATENCY_QUEUE] + sum(
            seconds(s) for s in children_named(run, root, sc.SPAN_PREEMPTED)
        )
        assert waits == pytest.approx(meta["queue_time"], abs=ABS), meta["id"]


def test_first_token_and_e2e_against_sglang(run: dict[str, Any]) -> None:
    # Same start (the tokenizer's created_time, carried to the scheduler). SGLang's first token is its
    # prefill_finished_time (offline, non-streaming), set while the prefill result is processed; ours is
    # when that result is streamed out, later in the same call. SGLang's end is when its tokenizer got
    # the last output, after ours (the scheduler streamed it). So ours lie between, within one step.
    for meta, root in by_request(run):
        attrs = root["attributes"]
        ttft = attrs[sc.LLM_LATENCY_TTFT]
        assert meta["first_token_latency"] - ABS <= ttft, meta["id"]
        assert ttft <= meta["first_token_latency"] + 0.5, meta["id"]
        assert attrs[sc.LLM_LATENCY_E2E] <= meta["e2e_latency"] + ABS, meta["id"]
        assert attrs[sc.LLM_LATENCY_E2E] >= meta["e2e_latency"] - 0.5, meta["id"]


def test_retracted_trace_has_the_vllm_shape(run: dict[str, Any]) -> None:
    retracted = [(m, r) for m, r in by_request(run) if m["num_retractions"]]
    assert retracted
    for meta, root in retracted:
        phases = {s["name"]: s for s in children(run, root)}
        # llm.admission covers [arrival, queued]: the tokenizer's stamp is always before the queue's.
        assert set(phases) == {sc.SPAN_ADMISSION, sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE}
        pairs = children(run, phases[sc.SPAN_DECODE]) + children(run, phases[sc.SPAN_PREFILL])
        names = [s["name"] for s in sorted(pairs, key=lambda s: s["start"])]
        assert names == [sc.SPAN_PREEMPTED, sc.SPAN_RECOMPUTE] * meta["num_retractions"], meta["id"]
        assert root["events"].count(sc.EVENT_PREEMPTED) == meta["num_retractions"]


def admissions(run: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per request, SGLang's own figures of each admission, in order, as its scheduler process held them
    right after building the prefill batch (drive_engine.py's ``prefills``): the batch's ``prefix_lens``
    (tokens its radix cache matched) and ``extend_lens`` (tokens it then computed)."""
    by_rid: dict[str, list[dict[str, Any]]] = {}
    for row in run["prefills"]:
        rows = by_rid.setdefault(row["rid"], [])
        if not rows or rows[-1]["stamp"] != row["stamp"]:  # a later chunk of one admission: same stamp
            rows.append(row)
    return by_rid


def test_recompute_work_equals_what_sglang_computed(run: dict[str, Any]) -> None:
    # At each re-admission of a retracted request SGLang computes extend_len tokens of its context
    # (prompt + output so far) and reuses prefix_len from its radix cache; at the first admission
    # prefix_len is the prompt's cache hit. Ours: llm.recompute.tokens / .cached_tokens per retraction,
    # in order, their sums on llm.request and in the counters, the first hit as cache_read.input_tokens
    # and the first admissions' prompt tokens by source.
    sglang = admissions(run)
    totals = {"recomputed": 0, "reused": 0, "computed": 0, "cached": 0}
    for meta, root in by_request(run):
        rows = sglang[meta["id"]]
        assert [r["retractions"] for r in rows] == list(range(meta["num_retractions"] + 1)), meta["id"]
        # No admission here is chunked: each computed the rest of its context in one batch.
        assert all(r["prefix_len"] + r["extend_len"] == r["context"] for r in rows), rows
        first, again = rows[0], rows[1:]
        attrs = root["attributes"]
        assert attrs[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == first["prefix_len"], meta["id"]
        ours = [
            (s["attributes"][sc.LLM_RECOMPUTE_TOKENS], s["attributes"][sc.LLM_RECOMPUTE_CACHED_TOKENS])
            for s in children_named(run, root, sc.SPAN_RECOMPUTE)
        ]
        assert ours == [(r["extend_len"], r["prefix_len"]) for r in again], meta["id"]
        recomputed = sum(r["extend_len"] for r in again)
        reused = sum(r["prefix_len"] for r in again)
        assert attrs.get(sc.LLM_PREEMPTIONS_RECOMPUTE_TOKENS, 0) == recomputed, meta["id"]
        assert attrs.get(sc.LLM_PREEMPTIONS_RECOMPUTE_CACHED_TOKENS, 0) == reused, meta["id"]
        totals["recomputed"] += recomputed
        totals["reused"] += reused
        totals["computed"] += first["extend_len"]
        totals["cached"] += first["prefix_len"]
    assert totals["recomputed"] > 0, "no retraction recomputed anything: the case is not exercised"
    assert counter(run, sc.METRIC_RECOMPUTE_TOKENS) == totals["recomputed"]
    assert counter(run, sc.METRIC_RECOMPUTE_CACHED_TOKENS) == totals["reused"]
    by_source = {
        attribute(p, sc.LLM_PROMPT_TOKENS_SOURCE): int(p.get("as_int", 0))
        for p in metric_points(run, sc.METRIC_PROMPT_TOKENS)
    }
    assert by_source.get(sc.PROMPT_SOURCE_COMPUTED, 0) == totals["computed"]
    assert by_source.get(sc.PROMPT_SOURCE_PREFIX_CACHE, 0) == totals["cached"]
    assert not by_source.get(sc.PROMPT_SOURCE_KV_TRANSFER, 0)


def counter(run: dict[str, Any], name: str) -> int:
    return sum(int(p.get("as_int", 0)) for p in metric_points(run, name))


def test_metrics_count_what_sglang_counted(run: dict[str, Any]) -> None:
    (preemptions,) = metric_points(run, sc.METRIC_PREEMPTIONS) or [{"as_int": "0"}]
    assert int(preemptions.get("as_int", 0)) == sum(m["num_retractions"] for m in run["meta"])
    points = metric_points(run, sc.METRIC_TOKENS)
    tokens = {attribute(p, sc.GEN_AI_TOKEN_TYPE): int(p["as_int"]) for p in points}
    assert tokens == {
        "input": sum(m["prompt_tokens"] for m in run["meta"]),
        "output": sum(m["completion_tokens"] for m in run["meta"]),
    }
    assert not metric_points(run, sc.METRIC_ANOMALIES), "lifecycle anomalies (e.g. a duplicate finish)"


def attribute(point: dict[str, Any], key: str) -> Any:
    return next(next(iter(a["value"].values())) for a in point["attributes"] if a["key"] == key)


def test_coexists_with_sglang_enable_trace(engine_runs: dict[str, dict[str, Any]]) -> None:
    # SGLang's --enable-trace sets the global tracer provider in each process; ours then sends through
    # it (SGLang's gRPC endpoint) and installs no second one: one llm.request per request, nothing twice.
    run = engine_runs["traced"]
    assert run["arrived"]
    assert not run["spans"], "otel_llm spans also went through a second pipeline"
    spans = run["grpc_spans"]
    ours = [s for s in spans if s["name"] == sc.SPAN_REQUEST]
    assert sorted(s["attributes"][sc.LLM_REQUEST_ID] for s in ours) == sorted(m["id"] for m in run["meta"])
    assert any(not s["name"].startswith("llm.") for s in spans), "SGLang's own spans are missing"
    ids = [s["span_id"] for s in spans]
    assert len(ids) == len(set(ids)), "a span was exported twice"


def test_early_eos_under_the_overlap_scheduler_finishes_each_request_once(
    engine_runs: dict[str, dict[str, Any]],
) -> None:
    # The overlap scheduler streams a request that stopped on EOS as finished a second time (from the
    # batch already launched behind it); each request must still finish once, with SGLang's counts.
    run = engine_runs["early_eos"]
    assert run["overlap"], "SGLang ran without its overlap scheduler: the case is not exercised"
    reasons = [m["finish_reason"]["type"] for m in run["meta"]]
    assert "stop" in reasons and "length" in reasons, reasons
    assert run["arrived"]
    assert set(roots(run)) == {m["id"] for m in run["meta"]}
    test_token_counts_equal_sglang(run)
    assert not metric_points(run, sc.METRIC_ANOMALIES), "lifecycle anomalies (e.g. a duplicate finish)"
    finished = sum(int(p["as_int"]) for p in metric_points(run, sc.METRIC_REQUESTS))
    assert finished == len(run["meta"])


def test_instrument_uninstrument_round_trip_on_sglang_classes(sglang_python: Path) -> None:
    # SGLang's own classes (no engine started): every replaced attribute wraps SGLang's, a second
    # instrument() changes nothing, uninstrument() restores the very same objects, and it can repeat.
    proc = subprocess.run(
        [str(sglang_python), str(HERE / "roundtrip.py")],
        cwd="/",
        env=sglang_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    everything = report["attributes"]
    assert len(everything) == 7
    assert sorted(report["instrumented_changed"]) == everything
    assert all(report["wraps_original"].values()), report["wraps_original"]
    assert report["second_instrument_kept"]
    assert sorted(report["restored_identical"]) == everything
    assert sorted(report["reinstrumented_changed"]) == everything


_DEFERRED = """
import json, sys
from otel_llm.integrations.sglang import SGLangInstrumentor
instrumentor = SGLangInstrumentor()
instrumentor.instrument(skip_dep_check=True)   # as opentelemetry-instrument's loader calls it
before = {"sglang_imported": "sglang" in sys.modules, "instrumented": instrumentor.is_instrumented}
import sglang.srt.managers.scheduler            # the program starts using SGLang
after = instrumentor.is_instrumented
instrumentor.uninstrument()
print(json.dumps({**before, "after_import": after, "after_uninstrument": instrumentor.is_instrumented}))
"""


def test_installed_but_not_imported_sglang_is_instrumented_only_when_imported() -> None:
    """Under opentelemetry-instrument, a process that never imports SGLang pays nothing for it."""
    proc = subprocess.run(
        [str(SGLANG_PYTHON), "-c", _DEFERRED],
        cwd="/",
        env=sglang_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {
        "sglang_imported": False,
        "instrumented": False,
        "after_import": True,
        "after_uninstrument": False,
    }
