"""``otel-llm demo``: the reference engine on a workload sized to preempt, exported through configure().

Requests arrive staggered (by engine step, so a seed gives the same run on any machine) with mixed
prompt and output lengths onto a KV cache too small for all of them. They are chat traffic
(``otel_llm.kit.commands.chat``): one shared system prompt, single questions and a few multi-turn
conversations, so most requests read part of their prompt from the prefix cache. The summary's
latencies come from this run's finished ``llm.request`` spans (a second, in-memory span processor next
to the exporter) and inter-token latency from the engine's own per-step token timestamps.
"""

from __future__ import annotations

import argparse
import time

from otel_llm.kit.commands import env_check
from otel_llm.kit.commands._common import (
    TELEMETRY_OFF,
    check_device,
    configure_run,
    delivery_lines,
    destinations,
    device_name,
    install_line,
    need_extras,
    positive_int,
    sdk_disabled,
    seed,
    usage_error,
    warn_if_unreachable,
    written_files,
)
from otel_llm.kit.commands.preflight import output_folder_problem
from otel_llm.kit.commands.workload import chat_question

DEFAULT_KV_BLOCKS = 24  # too few for the workload's requests at once: some are preempted
WORKLOAD_MAX_LEN = 400  # tokens of the longest request (prompt and output), where the cache holds it

# How to send the same run to a collector and look at it in Jaeger (collector-config/local/ starts both).
COLLECTOR_HINT = (
    "OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 otel-llm demo (a collector's OTLP/HTTP port), then "
    "find service otel-llm-demo in Jaeger (http://localhost:16686; collector-config/local/ starts both)"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the reference torch engine on a workload that preempts",
        description="Run the reference torch engine on a workload that preempts, print a summary and the "
        "waterfall of the most preempted request. Without an endpoint, telemetry goes to OTLP JSON files.",
        epilog=f"To a collector instead: {COLLECTOR_HINT}",
    )
    p.add_argument("--requests", type=positive_int, default=32, help="number of requests (default 32)")
    p.add_argument(
        "--kv-blocks",
        type=positive_int,
        default=None,
        help="KV cache blocks of 16 tokens (default 24; with --disaggregated, the prefill worker's: 10)",
    )
    p.add_argument("--seed", type=seed, default=0, help="seed of the workload and the model weights")
    p.add_argument("--device", type=device_name, default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument(
        "--output-dir",
        default=None,
        help="folder under which this run's OTLP JSON files go, in a new <demo-time-pid> folder "
        "(no endpoint set; default ./otel-llm-output)",
    )
    p.add_argument("--step-spans", action="store_true", help="also emit one llm.engine.step span per step")
    p.add_argument(
        "--disaggregated",
        action="store_true",
        help="run a prefill worker and a decode worker process, the KV cache sent between them "
        "(their KV caches: --kv-blocks 10 and 16 blocks unless given)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Everything that can be found wrong without the model is, before torch is imported.
    env_check.check("demo")
    problem = output_folder_problem(args.output_dir)
    if problem is not None:
        usage_error("demo", problem)
    need_extras("demo", "torch")
    console, Progress = _rich("demo")
    problem = check_device(args.device)
    if problem is not None:
        usage_error("demo", problem)
    if args.disaggregated:
        from otel_llm.kit.commands.demo_disaggregated import run_disaggregated

        return run_disaggregated(args, console)
    blocks_given = args.kv_blocks is not None
    if not blocks_given:
        args.kv_blocks = DEFAULT_KV_BLOCKS

    from otel_llm.kit.commands.chat import ChatClient, make_chat_workload
    from otel_llm.kit.commands.local_copy import tracker_with_local_copy
    from otel_llm.kit.commands.summary import (
        causes_text,
        engine_time_line,
        stall_counts,
        summary_table,
        telling_stall,
    )
    from otel_llm.kit.commands.view import emit, render_lines, terminal_width
    from otel_llm.kit.engine import EngineConfig, LLMEngine, ModelConfig
    from otel_llm.kit.waterfall import from_readable_spans, group_requests, pick_request
    from otel_llm.kit.waterfall_render import stall_words

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
    telemetry = configure_run("demo", args.output_dir)
    warn_if_unreachable("demo", telemetry)  # once, at the start, as serve does
    tracker, spans = tracker_with_local_copy(telemetry, model="otel-llm-tiny")
    engine = LLMEngine(
        config,
        tracker=tracker,
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
    )
    max_len = min(config.kv_capacity, WORKLOAD_MAX_LEN)
    workload = make_chat_workload(args.requests, args.seed, max_len, chat_question)
    client = ChatClient(workload, engine.tokenizer.encode, max_len)
    token_ts: dict[str, list[float]] = {}
    started = time.monotonic()
    with Progress(console=console(stderr=True), transient=True) as progress:
        bar = progress.add_task("serving", total=len(workload))
        step = 0
        while not client.done or engine.has_unfinished():
            nxt = client.next_arrival()
            if not engine.has_unfinished() and nxt is not None:
                step = max(step, nxt)  # idle engine: jump to the next arrival
            for rid, prompt, max_tokens in client.arrivals(step):
                engine.add_request(prompt, max_tokens=max_tokens, request_id=rid)
            for out in engine.step():
                token_ts.setdefault(out.request_id, []).append(out.ts)
                client.delivered(out.request_id, out.new_token_ids, out.finished, step)
                if out.finished:
                    progress.advance(bar)
            step += 1
    elapsed = time.monotonic() - started
    out = console(soft_wrap=True)
    if not hasattr(telemetry.tracer_provider, "add_span_processor"):
        # No spans, so no latency or preemption figures to show: what the engine did, and why no more.
        why = TELEMETRY_OFF if sdk_disabled() else "the tracer provider makes no spans"
        out.print(
            f"{len(workload)} requests in {elapsed:.1f} s, {step} engine steps, {engine.num_preemptions} "
            f"preemptions by the engine; {why}, so there is no summary table and no waterfall"
        )
        telemetry.shutdown()
        return 0
    # The summary reads the in-memory copy of the spans, so nothing waits on the exporters before it.
    requests = group_requests(from_readable_spans(spans.get_finished_spans()))
    out.print(summary_table(requests, token_ts, engine.num_preemptions, step, elapsed))
    if requests:
        emit(render_lines(pick_request(requests), width=terminal_width()), file=out.file)
    if blocks_given and engine.num_preemptions == 0:  # the point of the demo did not happen: say why
        out.print(no_preemption_note(args.kv_blocks, config.kv_capacity, max_len))
    stall = telling_stall(requests)
    if stall is not None:  # why one request's token waited, from the steps the engine reported
        out.print(f"stalls by cause: {causes_text(stall_counts(requests) or {})}")
        out.print(f"a stall: {stall[0].request_id}, {stall_words(stall[1])}")
    spent = engine_time_line(requests)
    if spent is not None:  # what the requests cost the engine, from the same steps
        out.print(spent)
    # One bounded step flushes and stops both providers (OTEL_LLM_SHUTDOWN_TIMEOUT, + 1 s at most).
    telemetry.shutdown()
    for line in delivery_lines(telemetry) + [d for d in destinations() if "OTLP" not in d]:
        out.print(line)
    files = written_files(telemetry)
    for path in files:
        out.print(f"{path.stem}: {path}")
    traces = [p for p in files if p.name == "traces.jsonl"]
    if traces:
        out.print(f"view a request: otel-llm view {traces[0]}")
        out.print(f"to a collector instead: {COLLECTOR_HINT}")
    return 0


def no_preemption_note(kv_blocks: int, capacity: int, max_len: int) -> str:
    """Why a demo with ``--kv-blocks`` given preempted nothing: its cache never ran short, and a tiny
    one shrank every request to fit it (``max_len`` tokens, prompt and output)."""
    note = f"no request was preempted: the KV cache of --kv-blocks {kv_blocks} ({capacity} tokens) "
    note += "never ran short"
    if max_len < WORKLOAD_MAX_LEN:
        note += f"; every request was shrunk to fit {max_len} tokens (prompt and output)"
    return f"{note}; the default, {DEFAULT_KV_BLOCKS} blocks, is sized to preempt"


def _rich(command: str) -> tuple[type, type]:
    """rich's Console and Progress, or exit with the install line (rich comes with the torch extra)."""
    try:
        from rich.console import Console
        from rich.progress import Progress
    except ImportError:
        raise SystemExit(
            f"otel-llm {command} prints with rich: in the otel-llm checkout, run "
            f"{install_line(['torch'], with_torch=False)}"
        ) from None
    return Console, Progress
