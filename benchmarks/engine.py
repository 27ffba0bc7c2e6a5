"""Section 5: the reference torch engine's steps per second with and without the tracker.

Same seed, same prompts, same configuration (up to 64 sequences per step); runs alternate between the
two variants so drift on a shared machine hits both. torch is held to one intra-op thread: on a small
shared machine, OpenMP worker threads spinning against other processes make step times swing by 10x,
which would drown the effect being measured. The tracker uses real SDK providers whose exporters discard.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.providers import discarding_providers
from benchmarks.report import Measure
from otel_llm import RequestTracker


@dataclass(frozen=True)
class EngineRun:
    """One run of the workload: steps, wall-clock and engine-thread CPU seconds, preemptions."""

    steps: int
    seconds: float  # time.perf_counter() seconds, start of the first step to the end of the last
    cpu_seconds: float  # time.thread_time() of the engine thread over the same steps
    preemptions: int


def one_run(
    tracker: Any, requests: int, max_tokens: int, num_kv_blocks: int = 160, report_batches: bool = False
) -> EngineRun:
    """Run ``requests`` requests of ``max_tokens`` tokens to completion, batch up to 64; the engine
    reports its batches (``RequestTracker.batch``, stalls explained) only with ``report_batches``, so the
    figures without it stay comparable with earlier runs.

    160 KV blocks (of 16 tokens) is the stress workload: about a third of the requests are preempted.
    The engine thread's CPU time is reported beside the wall clock because it leaves out the time this
    process waited for a core: on a shared machine it moves much less from run to run."""
    from otel_llm.kit.engine import EngineConfig, LLMEngine

    engine = LLMEngine(
        EngineConfig(
            max_num_seqs=64,
            num_kv_blocks=num_kv_blocks,
            max_num_batched_tokens=512,
            report_batches=report_batches,
        ),
        tracker=tracker,
    )
    for i in range(requests):
        engine.add_request(f"request {i}: tell me a story", max_tokens=max_tokens)
    steps = 0
    cpu_start = time.thread_time()
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
        steps += 1
    seconds = time.perf_counter() - start
    return EngineRun(steps, seconds, time.thread_time() - cpu_start, engine.num_preemptions)


def run(quick: bool, rounds: int) -> list[Measure]:
    try:
        import torch
    except ImportError:
        return [Measure("engine", "skipped: torch is not installed", "steps/s", float("nan"))]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    providers = discarding_providers()
    try:
        requests, max_tokens = (8, 4) if quick else (96, 24)
        one_run(None, requests, max_tokens)  # warm-up: first-use costs of torch kernels
        rates: dict[str, list[float]] = {"without": [], "with": [], "with batch()": []}
        steps = 0
        for _ in range(rounds):
            for name in rates:
                tracker = None
                if name != "without":
                    tracker = RequestTracker(
                        tracer_provider=providers.tracer_provider,
                        meter_provider=providers.meter_provider,
                        model="tiny",
                    )
                result = one_run(tracker, requests, max_tokens, report_batches=name == "with batch()")
                steps = result.steps
                rates[name].append(steps / result.seconds)
        with_, without = statistics.median(rates["with"]), statistics.median(rates["without"])
        batches = statistics.median(rates["with batch()"])
        note = (
            f"{requests} requests x {max_tokens} output tokens, batch up to 64, {steps} steps per run, "
            f"{rounds} runs each"
        )
        return [
            Measure(
                "engine",
                "steps per second with the tracker",
                "steps/s",
                with_,
                {"without the tracker": without},
                spread=(min(rates["with"]), max(rates["with"])),
                note=note,
            ),
            Measure("engine", "steps per second lost to the tracker", "fraction", 1 - with_ / without),
            Measure(
                "engine",
                "steps per second with the tracker, the engine reporting its batches (batch())",
                "steps/s",
                batches,
                {"without the tracker": without, "the tracker without batch()": with_},
                spread=(min(rates["with batch()"]), max(rates["with batch()"])),
                note="batch() once per step, and each finished request's stalls found",
            ),
        ]
    finally:
        torch.set_num_threads(threads)
        providers.shutdown()
