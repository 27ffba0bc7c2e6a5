"""The reference engine with otel_llm's hook: one trace per request, preemptions included.

Run: python examples/engine_demo.py. With no OTLP endpoint configured, the traces and metrics land as
OTLP JSON lines in a new folder per run, ./otel-llm-output/engine-demo-<date>-<time>-<pid>/ (under
$OTEL_LLM_OUTPUT_DIR when set), so the request ids of two runs never mix; the script prints that folder
and the ``otel-llm view`` command for it. Set OTEL_EXPORTER_OTLP_ENDPOINT to send them to a collector.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

import otel_llm
from otel_llm.kit.engine import EngineConfig, LLMEngine


def run_folder() -> Path:
    """This run's own folder for the files: every run uses the ids req-0 ... req-3 again."""
    base = os.environ.get("OTEL_LLM_OUTPUT_DIR", "").strip() or "otel-llm-output"
    return Path(base) / time.strftime(f"engine-demo-%Y%m%d-%H%M%S-{os.getpid()}")


def main() -> None:
    # The model's matrices are tiny: more intra-op threads only wait for each other's cores.
    torch.set_num_threads(1)
    telemetry = otel_llm.configure(service_name="engine-example", output_dir=run_folder())
    tracker = otel_llm.RequestTracker(model="otel-llm-tiny")
    # 8 blocks of 16 tokens cannot hold these four requests at once: the scheduler preempts and recomputes.
    engine = LLMEngine(EngineConfig(num_kv_blocks=8), tracker=tracker)
    prompts = ["Tell me about paged attention.", "What is a KV cache?", "Why preempt?", "Hello " * 10]
    for prompt, text in zip(prompts, engine.generate(prompts, max_tokens=40), strict=True):
        print(f"{prompt[:30]!r:34} -> {text!r}")
    print("preemptions:", engine.num_preemptions)
    # Flushes within OTEL_LLM_SHUTDOWN_TIMEOUT (+ 1 s), even when the collector is down; False if it gave up.
    delivered = telemetry.shutdown()
    if telemetry.output_dir is not None:
        print(f"files: {telemetry.output_dir}")
        print(f"view the most preempted request: otel-llm view {telemetry.output_dir}")
    else:
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "the configured OTLP endpoint")
        lost = telemetry.drops.total("spans")
        said = "sent to" if delivered and not lost else f"NOT all sent ({lost} spans dropped) to"
        print(f"traces and metrics: {said} {endpoint}")


if __name__ == "__main__":
    main()
