"""``otel-llm demo --disaggregated``: the demo workload on a prefill worker and a decode worker.

Both workers' KV caches are small (the prefill worker's also caps each prompt's chunk per step, so long
prompts prefill side by side), so requests are preempted on both sides. Each worker writes its own OTLP
JSON files (``<run folder>/prefill/``, ``<run folder>/decode/``); the summary and the waterfall read them
back after the workers have stopped, so they show exactly what was exported.
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from otel_llm.kit.commands._common import (
    SERVICE_INSTANCE_ID,
    TELEMETRY_OFF,
    run_dir,
    sdk_disabled,
    worker_delivery_lines,
)

PREFILL_KV_BLOCKS = 10
DECODE_KV_BLOCKS = 16
PREFILL_CHUNK = 16  # tokens of one prompt per prefill step (long_prefill_token_threshold)


def run_disaggregated(args: argparse.Namespace, console: Any) -> int:
    from otel_llm import semconv as sc
    from otel_llm.kit.commands.view import emit, load_all, render_lines, terminal_width
    from otel_llm.kit.commands.workload import make_workload
    from otel_llm.kit.engine import ByteTokenizer, EngineConfig, ModelConfig
    from otel_llm.kit.engine.disaggregated import DisaggregatedEngine, Submit
    from otel_llm.kit.waterfall import group_requests, pick_request

    model = ModelConfig(seed=args.seed)
    prefill = EngineConfig(
        model=model,
        num_kv_blocks=args.kv_blocks or PREFILL_KV_BLOCKS,
        max_num_batched_tokens=64,
        long_prefill_token_threshold=PREFILL_CHUNK,
        device=args.device,
    )
    decode = EngineConfig(model=model, num_kv_blocks=DECODE_KV_BLOCKS, device=args.device)
    out_dir = run_dir(args.output_dir, "demo")
    max_len = min(prefill.kv_capacity, decode.kv_capacity, 400)
    workload = make_workload(args.requests, args.seed, max_len)
    tokenizer = ByteTokenizer()
    out = console(soft_wrap=True)
    started = time.monotonic()
    engine = DisaggregatedEngine(
        prefill, decode, output_dir=out_dir, resource_attributes={SERVICE_INSTANCE_ID: uuid.uuid4().hex}
    )
    done = 0
    step = 0
    for i, req in enumerate(workload):
        while step < req.arrival_step:  # arrivals paced in 5 ms steps
            done += sum(o.finished for o in engine.outputs(0.005))
            step += 1
        engine.submit(Submit(f"req-{i:03d}", tokenizer.encode(req.prompt), req.max_tokens, time.monotonic()))
    done += sum(o.finished for o in engine.close())
    elapsed = time.monotonic() - started
    # Sent over OTLP, the spans went to the collector and no folder was made: the summary has no
    # preemption counts and no waterfall to show then.
    to_files = any(out_dir.glob("*/*.jsonl"))
    records = load_all([str(out_dir)]) if to_files else []
    requests = group_requests(records)
    pre_preempted = sum(
        int(r.attributes.get(sc.LLM_PREEMPTIONS, 0)) for r in records if r.name == sc.SPAN_INSTANCE_PREFILL
    )
    dec_preempted = sum(
        int(r.attributes.get(sc.LLM_PREEMPTIONS, 0))
        for r in records
        if r.name == sc.SPAN_REQUEST and r.attributes.get(sc.LLM_ROLE) == sc.ROLE_DECODE
    )
    if sdk_disabled():  # the workers made no spans: no counts to give, and none at a collector
        preemptions = f"{TELEMETRY_OFF}, so there is no preemption count and no waterfall"
    elif to_files:
        preemptions = (
            f"preemptions: {pre_preempted} on the prefill worker, {dec_preempted} on the decode worker"
        )
    else:
        preemptions = "preemptions: in the spans at the collector"
    out.print(f"{done} of {len(workload)} requests in {elapsed:.1f} s on two worker processes; {preemptions}")
    if requests:
        emit(render_lines(pick_request(requests), width=terminal_width()), file=out.file)
    for line in worker_delivery_lines(engine.delivery):  # over OTLP: each worker's delivered and lost
        out.print(line)
    if to_files:
        out.print(f"traces and metrics of both workers: {out_dir}")
        out.print(f"view a request: otel-llm view {out_dir}")
    return 0
