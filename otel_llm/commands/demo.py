"""``otel-llm demo``: the reference engine on a workload sized to preempt, exported through configure().

Requests arrive staggered (by engine step, so a seed gives the same run on any machine) with mixed
prompt and output lengths onto a KV cache too small for all of them. The summary's latencies come from
this run's finished ``llm.request`` spans (a second, in-memory span processor next to the exporter)
and inter-token latency from the engine's own per-step token timestamps.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass

_WORDS = (
    "token", "cache", "block", "prefill", "decode", "queue", "batch", "stream", "attention", "layer",
    "paged", "request", "engine", "model", "latency", "trace", "span", "metric", "schedule", "preempt",
    "recompute", "tensor", "kernel", "memory",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class DemoRequest:
    arrival_step: int  # the engine step at which the request arrives
    prompt: str
    max_tokens: int


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="run the reference torch engine on a workload that preempts")
    p.add_argument("--requests", type=int, default=32, help="number of requests (default 32)")
    p.add_argument("--kv-blocks", type=int, default=24, help="KV cache blocks of 16 tokens (default 24)")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and the model weights")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--output-dir", default=None, help="directory of the OTLP JSON files (no endpoint set)")
    p.add_argument("--step-spans", action="store_true", help="also emit one llm.engine.step span per step")
    p.set_defaults(func=run)


def make_workload(n: int, seed: int, max_len: int) -> list[DemoRequest]:
    """Mostly short prompts, some long ones (chunked prefill), outputs of 8 to 64 tokens."""
    rng = random.Random(seed)
    step, out = 0, []
    for _ in range(n):
        step += rng.choice((0, 1, 2, 4, 8))
        max_tokens = rng.randint(8, 64)
        target = rng.randint(150, max_len - max_tokens) if rng.random() < 0.2 else rng.randint(10, 120)
        words: list[str] = []
        while len(" ".join(words)) < target:
            words.append(rng.choice(_WORDS))
        prompt = " ".join(words)[: max(1, min(target, max_len - max_tokens))]
        out.append(DemoRequest(step, prompt, max_tokens))
    return out


def run(args: argparse.Namespace) -> int:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from rich.console import Console
    from rich.progress import Progress

    import otel_llm
    from otel_llm.commands.summary import summary_table
    from otel_llm.commands.view import axis_width, render_waterfall
    from otel_llm.engine import EngineConfig, LLMEngine, ModelConfig
    from otel_llm.waterfall import from_readable_spans, group_requests, pick_request

    if args.requests < 1:
        raise SystemExit("otel-llm demo: --requests must be >= 1")
    if args.device == "cpu":
        import torch

        # The model's matrices are tiny: a second intra-op thread buys nothing and, on a busy 2-core
        # machine, makes each step wait for a core (measured: 0.56 s vs 1.75 s with another process busy).
        torch.set_num_threads(1)
    config = EngineConfig(
        model=ModelConfig(seed=args.seed),
        num_kv_blocks=args.kv_blocks,
        device=args.device,
        step_spans=args.step_spans,
    )
    telemetry = otel_llm.configure(service_name="otel-llm-demo", output_dir=args.output_dir, set_global=False)
    spans = InMemorySpanExporter()
    if hasattr(telemetry.tracer_provider, "add_span_processor"):  # absent when OTEL_SDK_DISABLED=true
        telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    tracker = otel_llm.RequestTracker(
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
        model="otel-llm-tiny",
    )
    engine = LLMEngine(
        config,
        tracker=tracker,
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
    )
    workload = make_workload(args.requests, args.seed, min(config.kv_capacity, 400))
    token_ts: dict[str, list[float]] = {}
    console = Console()
    started = time.monotonic()
    with Progress(console=Console(stderr=True), transient=True) as progress:
        bar = progress.add_task("serving", total=len(workload))
        step, nxt = 0, 0
        while nxt < len(workload) or engine.has_unfinished():
            if not engine.has_unfinished():
                step = max(step, workload[nxt].arrival_step)  # idle engine: jump to the next arrival
            while nxt < len(workload) and workload[nxt].arrival_step <= step:
                req = workload[nxt]
                engine.add_request(req.prompt, max_tokens=req.max_tokens, request_id=f"req-{nxt:03d}")
                nxt += 1
            for out in engine.step():
                token_ts.setdefault(out.request_id, []).append(out.ts)
                if out.finished:
                    progress.advance(bar)
            step += 1
    elapsed = time.monotonic() - started
    tracker.force_flush()
    telemetry.force_flush()
    requests = group_requests(from_readable_spans(spans.get_finished_spans()))
    console.print(summary_table(requests, token_ts, engine.num_preemptions, step, elapsed))
    if requests:
        console.print(render_waterfall(pick_request(requests), width=axis_width(console)))
    if telemetry.output_dir is not None:
        console.print(
            f"traces and metrics: {telemetry.output_dir}  (otel-llm view {telemetry.output_dir}/traces.jsonl)"
        )
    telemetry.shutdown()
    return 0
