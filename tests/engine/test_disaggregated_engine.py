"""The disaggregated reference engine in real processes (spawned prefill and decode workers, the KV cache
sent over a Unix socket), read back from the OTLP JSON files each worker exported: per request one
trace, both instances' documented spans without gaps or overlaps, a transfer span on each side, TTFT by
the documented rule, metrics per role, and the same tokens as one engine serving the whole request."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

from otel_llm import semconv as sc
from otel_llm.kit.commands.view import load_all, render_lines
from otel_llm.kit.commands.workload import make_workload
from otel_llm.kit.engine import ByteTokenizer, EngineConfig, LLMEngine
from otel_llm.kit.engine.disaggregated import DisaggregatedEngine, Submit
from otel_llm.kit.waterfall import group_requests

PREFILL = EngineConfig(num_kv_blocks=10, max_num_batched_tokens=64, long_prefill_token_threshold=16)
DECODE = EngineConfig(num_kv_blocks=12)
N = 16


@pytest.fixture(scope="module", params=["process", "in_process"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run per export mode (the workers read OTEL_LLM_EXPORT_MODE as they start; process is the
    default): every test here holds in both."""
    out = tmp_path_factory.mktemp(f"disagg-{request.param}")
    workload = make_workload(N, 0, 150)
    tok = ByteTokenizer()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_LLM_EXPORT_MODE", request.param)
        return _run(out, workload, tok)


def _run(out: Path, workload: Any, tok: ByteTokenizer) -> dict[str, Any]:
    engine = DisaggregatedEngine(PREFILL, DECODE, output_dir=out)
    tokens: dict[str, list[int]] = {}
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}  # monotonic seconds of the step that delivered the first tokens

    def take(outputs: list[Any]) -> None:
        for o in outputs:
            tokens.setdefault(o.request_id, []).extend(o.token_ids)
            first.setdefault(o.request_id, o.ts)

    for i, req in enumerate(workload):
        rid = f"req-{i:03d}"
        arrival[rid] = time.monotonic()
        engine.submit(Submit(rid, tok.encode(req.prompt), req.max_tokens, arrival[rid]))
        take(engine.outputs(0.002))
    take(engine.close())
    ttft = {rid: first[rid] - arrival[rid] for rid in first}
    return {"out": out, "workload": workload, "tokens": tokens, "ttft": ttft}


def test_the_decode_worker_continues_from_the_transferred_kv(run: dict[str, Any]) -> None:
    whole = LLMEngine(EngineConfig(num_kv_blocks=64))  # one engine, no transfer: the reference tokens
    ids = [whole.add_request(r.prompt, r.max_tokens, f"req-{i:03d}") for i, r in enumerate(run["workload"])]
    expected: dict[str, list[int]] = {rid: [] for rid in ids}
    while whole.has_unfinished():
        for o in whole.step():
            expected[o.request_id] += o.new_token_ids
    assert run["tokens"] == expected


def spans_by_trace(out: Path) -> dict[str, list[Any]]:
    records = load_all([str(out)])
    traces: dict[str, list[Any]] = {}
    for r in records:
        traces.setdefault(r.trace_id, []).append(r)
    return traces


def test_one_trace_per_request_with_both_instances(run: dict[str, Any]) -> None:
    traces = spans_by_trace(run["out"])
    assert len(traces) == N
    preempted = {sc.SPAN_INSTANCE_PREFILL: 0, sc.SPAN_INSTANCE_DECODE: 0}
    for spans in traces.values():
        (root,) = [s for s in spans if s.name == sc.SPAN_REQUEST]
        (p_inst,) = [s for s in spans if s.name == sc.SPAN_INSTANCE_PREFILL]
        (d_inst,) = [s for s in spans if s.name == sc.SPAN_INSTANCE_DECODE]
        assert p_inst.parent_id == root.span_id == d_inst.parent_id
        assert abs(p_inst.start_ns - root.start_ns) < 20_000 and d_inst.end_ns == root.end_ns  # A: 2 clocks
        expected = {
            sc.SPAN_INSTANCE_PREFILL: [sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_KV_TRANSFER],
            sc.SPAN_INSTANCE_DECODE: [sc.SPAN_KV_TRANSFER, sc.SPAN_QUEUE, sc.SPAN_DECODE],
        }
        for inst in (p_inst, d_inst):
            kids = sorted((s for s in spans if s.parent_id == inst.span_id), key=lambda s: s.start_ns)
            names = [s.name for s in kids if s.name != sc.SPAN_ADMISSION]
            assert names == expected[inst.name]
            assert kids[0].start_ns == inst.start_ns and kids[-1].end_ns == inst.end_ns
            for a, b in itertools.pairwise(kids):
                assert a.end_ns == b.start_ns, (inst.name, a.name, b.name)  # no gap, no overlap
            transfer = next(s for s in kids if s.name == sc.SPAN_KV_TRANSFER)
            assert transfer.attributes[sc.LLM_KV_TRANSFER_BYTES] > 0
            phases = {s.span_id for s in kids}
            preempted[inst.name] += sum(
                1 for s in spans if s.name == sc.SPAN_PREEMPTED and s.parent_id in phases
            )
        # TTFT: the decode instance's first delivered token - the prefill instance's arrival.
        (decode,) = [s for s in spans if s.name == sc.SPAN_DECODE]
        ttft = root.attributes[sc.LLM_LATENCY_TTFT]
        assert ttft > (decode.start_ns - root.start_ns) / 1e9 - 1e-5
        assert ttft == pytest.approx(
            root.attributes[sc.LLM_LATENCY_E2E]
            - (root.end_ns - decode.start_ns) / 1e9
            + root.attributes[sc.LLM_LATENCY_TTFT]
            - (decode.start_ns - root.start_ns) / 1e9,
            abs=1e-4,
        )
    assert preempted[sc.SPAN_INSTANCE_PREFILL] > 0 and preempted[sc.SPAN_INSTANCE_DECODE] > 0


def last_points(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Data points of the last export of each metric in an OTLP JSON metrics file."""
    points: dict[str, list[dict[str, Any]]] = {}
    for line in path.read_text().splitlines():
        for rm in json.loads(line).get("resourceMetrics", []):
            for sm in rm.get("scopeMetrics", []):
                for m in sm.get("metrics", []):
                    data = m.get("histogram") or m.get("sum") or m.get("gauge") or {}
                    points[m["name"]] = data.get("dataPoints", [])
    return points


def attrs(point: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in point.get("attributes", [])}


def test_metrics_per_role(run: dict[str, Any]) -> None:
    for role in (sc.ROLE_PREFILL, sc.ROLE_DECODE):
        points = last_points(run["out"] / role / "metrics.jsonl")
        (transfer,) = points[sc.METRIC_KV_TRANSFER]
        assert attrs(transfer)[sc.LLM_ROLE] == role and int(transfer["count"]) == N
        (sent,) = points[sc.METRIC_KV_TRANSFER_BYTES]
        assert int(sent["asInt"]) > 0 and attrs(sent)[sc.LLM_ROLE] == role
        assert int(points[sc.METRIC_PREEMPTIONS][0]["asInt"]) > 0
    pre = last_points(run["out"] / "prefill" / "metrics.jsonl")
    dec = last_points(run["out"] / "decode" / "metrics.jsonl")
    assert sc.METRIC_TTFT not in pre and int(dec[sc.METRIC_TTFT][0]["count"]) == N
    assert int(pre[sc.METRIC_PREFILL][0]["count"]) == N and sc.METRIC_PREFILL not in dec


def test_view_draws_both_instances(run: dict[str, Any]) -> None:
    (trace, *_) = group_requests(load_all([str(run["out"])]))
    text = "\n".join("".join(t for t, _ in line) for line in render_lines(trace, width=100))
    for name in (sc.SPAN_INSTANCE_PREFILL, sc.SPAN_INSTANCE_DECODE, sc.SPAN_KV_TRANSFER, sc.SPAN_DECODE):
        assert name in text
