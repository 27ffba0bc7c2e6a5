"""The reference engine with otel_llm's hook: one trace per request, preemptions included.

Run: python examples/engine_demo.py   (writes OTLP JSON files to ./otel-llm-output/ unless
OTEL_EXPORTER_OTLP_ENDPOINT is set), then: otel-llm view otel-llm-output/traces.jsonl
"""

from __future__ import annotations

import otel_llm
from otel_llm.engine import EngineConfig, LLMEngine

telemetry = otel_llm.configure(service_name="engine-example")
tracker = otel_llm.RequestTracker(model="otel-llm-tiny")
# 8 blocks of 16 tokens cannot hold these four requests at once: the scheduler preempts and recomputes.
engine = LLMEngine(EngineConfig(num_kv_blocks=8), tracker=tracker)
prompts = ["Tell me about paged attention.", "What is a KV cache?", "Why preempt?", "Hello " * 10]
for prompt, text in zip(prompts, engine.generate(prompts, max_tokens=40), strict=True):
    print(f"{prompt[:30]!r:34} -> {text!r}")
print("preemptions:", engine.num_preemptions)
telemetry.shutdown()
