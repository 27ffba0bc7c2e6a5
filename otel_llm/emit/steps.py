"""The attributes of an ``llm.engine.step`` span (trace detail ``steps``), from a record's step row.

The hook side remembers the engine's steps and puts a request's longest ones in its record
(``otel_llm.hooks.steps``, ``otel_llm.record.StepRow``); each becomes one span here.
"""

from __future__ import annotations

from typing import Any

from otel_llm import semconv as sc
from otel_llm.record import StepRow


def step_attributes(row: StepRow) -> dict[str, Any]:
    """``llm.engine.step.index`` and ``.batch_size``, and the step's tokens and KV-cache usage when the
    engine reported them (``engine_state()``)."""
    _, _, index, batch_size, tokens, kv_cache_usage = row
    attrs: dict[str, Any] = {sc.LLM_STEP_INDEX: index, sc.LLM_STEP_BATCH_SIZE: batch_size}
    if tokens is not None:
        attrs[sc.LLM_STEP_TOKENS] = tokens
    if kv_cache_usage is not None:
        attrs[sc.LLM_STEP_KV_CACHE_USAGE] = kv_cache_usage
    return attrs
