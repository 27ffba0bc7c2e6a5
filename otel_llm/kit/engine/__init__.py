"""A reference LLM inference engine in torch, instrumented only through otel_llm's public hook.

A tiny decoder-only transformer (random weights from a seed, byte-level tokens), a paged KV cache with
block tables, continuous batching with chunked prefill under a per-step token budget, and vLLM V1's
recompute preemption. It exists to show and test the instrumentation on a real engine::

    from otel_llm import RequestTracker
    from otel_llm.kit.engine import EngineConfig, LLMEngine

    engine = LLMEngine(EngineConfig(num_kv_blocks=16), tracker=RequestTracker(model="tiny"))
    print(engine.generate(["Hello", "How are you?"], max_tokens=8))

Needs the ``torch`` extra. The core of otel_llm never imports this package.
"""

from __future__ import annotations

from otel_llm.kit.engine.async_engine import AsyncLLMEngine, RequestStream
from otel_llm.kit.engine.config import EngineConfig, ModelConfig
from otel_llm.kit.engine.engine import LLMEngine, RequestOutput
from otel_llm.kit.engine.telemetry import (
    METRIC_KV_BLOCKS_TOTAL,
    METRIC_KV_BLOCKS_USED,
    METRIC_REQUESTS_RUNNING,
    METRIC_REQUESTS_WAITING,
    METRIC_STEP_FORWARD,
    METRIC_STEP_TOKENS,
    METRIC_TOKENS,
)
from otel_llm.kit.engine.tokenizer import ByteTokenizer

__all__ = [
    "METRIC_KV_BLOCKS_TOTAL",
    "METRIC_KV_BLOCKS_USED",
    "METRIC_REQUESTS_RUNNING",
    "METRIC_REQUESTS_WAITING",
    "METRIC_STEP_FORWARD",
    "METRIC_STEP_TOKENS",
    "METRIC_TOKENS",
    "AsyncLLMEngine",
    "ByteTokenizer",
    "EngineConfig",
    "LLMEngine",
    "ModelConfig",
    "RequestOutput",
    "RequestStream",
]
