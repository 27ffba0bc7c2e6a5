"""Section 5: the reference torch engine's steps per second with and without the tracker.

Same seed, same prompts, same configuration (up to 64 sequences per step); runs alternate between the
two variants so drift on a shared machine hits both. torch is held to one intra-op thread: on a small
shared machine, OpenMP worker threads spinning against other processes make step times swing by 10x,
which would drown the effect being measured. The tracker uses real SDK providers whose exporters discard.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.providers import discarding_providers
from benchmarks.report import Measure
from otel_llm import RequestTracker


def one_run(tracker: Any, requests: int, max_tokens: int) -> tuple[int, float]:
    from otel_llm.engine import EngineConfig, LLMEngine

    engine = LLMEngine(
        EngineConfig(max_num_seqs=64, num_kv_blocks=160, max_num_batched_tokens=512), tracker=tracker
    )
    for i in range(requests):
        engine.add_request(f"request {i}: tell me a story", max_tokens=max_tokens)
    steps = 0
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return steps, time.perf_counter() - start


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
        rates: dict[str, list[float]] = {"without": [], "with": []}
        steps = 0
        for _ in range(rounds):
            for name in rates:
                tracker = None
                if name == "with":
                    tracker = RequestTracker(
                        tracer_provider=providers.tracer_provider,
                        meter_provider=providers.meter_provider,
                        model="tiny",
                    )
                steps, seconds = one_run(tracker, requests, max_tokens)
                rates[name].append(steps / seconds)
        with_, without = statistics.median(rates["with"]), statistics.median(rates["without"])
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
        ]
    finally:
        torch.set_num_threads(threads)
        providers.shutdown()
