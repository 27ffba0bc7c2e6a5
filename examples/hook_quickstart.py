"""The five-call hook in a toy scheduler loop: five requests, a KV budget too small, one preemption.

No model and no torch: each "step" sleeps a few milliseconds. With no OTLP endpoint configured, the
traces and metrics land as OTLP JSON lines in a new folder per run,
./otel-llm-output/hook-quickstart-<date>-<time>-<pid>/ (under $OTEL_LLM_OUTPUT_DIR when set), so the
same request ids of two runs never mix; set OTEL_EXPORTER_OTLP_ENDPOINT to send them to a collector
instead. Run:  python examples/hook_quickstart.py
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import otel_llm

KV_SLOTS = 3  # how many requests fit in the toy KV cache at once
STEP_S = 0.004  # one engine step


def run_folder() -> Path:
    """This run's own folder for the files: every run uses the ids req-0 ... req-4 again."""
    base = os.environ.get("OTEL_LLM_OUTPUT_DIR", "").strip() or "otel-llm-output"
    return Path(base) / time.strftime(f"hook-quickstart-%Y%m%d-%H%M%S-{os.getpid()}")


def main() -> None:
    telemetry = otel_llm.configure(service_name="hook-quickstart", output_dir=run_folder())
    tracker = otel_llm.RequestTracker(model="toy-model")
    wants = {f"req-{i}": 4 + 2 * i for i in range(5)}  # output tokens each request wants
    waiting = list(wants)
    running: list[str] = []
    produced = dict.fromkeys(wants, 0)
    for rid in waiting:
        tracker.queued(rid, prompt_tokens=16)  # 1. the request enters the waiting queue
    step = 0
    while waiting or running:
        now = time.monotonic()  # one timestamp per step, shared by the whole batch
        admitted = []
        while waiting and len(running) + len(admitted) < KV_SLOTS:
            admitted.append(waiting.pop(0))
        running += admitted
        if admitted:
            tracker.scheduled(admitted, ts=now)  # 2. newly admitted (or resumed) requests
        if step == 3 and len(running) == KV_SLOTS:
            victim = running.pop()  # out of KV blocks: evict the most recently admitted
            waiting.insert(0, victim)
            tracker.preempted([victim], ts=now)  # 4. its KV cache is gone; it will be recomputed
        time.sleep(STEP_S)  # the "forward pass"
        now = time.monotonic()
        tracker.tokens(running, ts=now)  # 3. every running request produced one token
        for rid in list(running):
            produced[rid] += 1
            if produced[rid] == wants[rid]:
                running.remove(rid)
                tracker.finished(rid, reason="length", ts=now)  # 5. it left the engine
        step += 1
    # Flushes within OTEL_LLM_SHUTDOWN_TIMEOUT (+ 1 s), even when the collector is down; False if it gave up.
    delivered = telemetry.shutdown()
    lost = telemetry.drops.total("spans")
    done = f"{len(wants)} requests traced in {step} steps"
    if delivered and not lost and telemetry.output_dir is not None:
        print(f"{done}; files: {telemetry.output_dir}")
        print(f"view the most preempted request: otel-llm view {telemetry.output_dir}")
    elif delivered and not lost:
        print(f"{done}; see your collector")
    else:
        print(
            f"{done}; NOT all delivered (collector down or slow?): "
            f"{lost} spans counted as dropped, the rest given up at shutdown"
        )


if __name__ == "__main__":
    main()
