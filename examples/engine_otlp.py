"""The reference torch engine exporting its traces and metrics over OTLP to a collector.

Start the local stack (``docker compose -f collector-config/local/compose.yaml up -d``), then run:

    python examples/engine_otlp.py

It sends to the collector's OTLP/gRPC port on localhost:4317 unless OTEL_EXPORTER_OTLP_ENDPOINT (and
OTEL_EXPORTER_OTLP_PROTOCOL) say otherwise. The KV cache is kept small so that some requests are
preempted: look for their llm.preempted and llm.recompute spans in Jaeger (service engine-otlp-example).
"""

from __future__ import annotations

import os
import random

import otel_llm
from otel_llm.kit.engine import EngineConfig, LLMEngine

SMOKE = os.environ.get("OTEL_LLM_EXAMPLE_SMOKE") == "1"  # tests run every example small
REQUESTS = 4 if SMOKE else 24
MAX_TOKENS = 24 if SMOKE else 64


def main() -> None:
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://localhost:4317"  # the compose stack's collector
        os.environ.setdefault("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    telemetry = otel_llm.configure(service_name="engine-otlp-example")  # also sets the global providers
    tracker = otel_llm.RequestTracker(model="otel-llm-tiny")
    # 16 blocks of 16 token slots hold two or three requests at full length (about 100 tokens each), so
    # the rest wait in the queue and running ones are preempted when their KV cache grows.
    engine = LLMEngine(EngineConfig(num_kv_blocks=16), tracker=tracker)
    rng = random.Random(0)
    prompts = [
        " ".join(rng.choice(["tell", "me", "about", "paged", "attention"]) for _ in range(8))
        for _ in range(REQUESTS)
    ]
    texts = engine.generate(prompts, max_tokens=MAX_TOKENS)
    endpoint = os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
    print(f"{len(texts)} requests, {engine.num_preemptions} preemptions")
    # Flushes spans and metrics within OTEL_LLM_SHUTDOWN_TIMEOUT (+ 1 s), even when the collector is down.
    delivered = telemetry.shutdown()
    lost = telemetry.drops.total("spans")
    if delivered and not lost:
        print(f"exported to {endpoint}")
    else:
        print(
            f"NOT all exported to {endpoint} (collector down or slow?): "
            f"{lost} spans counted as dropped, the rest given up at shutdown"
        )


if __name__ == "__main__":
    main()
