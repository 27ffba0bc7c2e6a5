"""otel_llm for SGLang: a trace with queue / prefill / decode / preemption spans for every request.

Installed with otel_llm in SGLang's environment, nothing else is needed: SGLang loads general plugins
(entry point group ``sglang.srt.plugins``) in each of its processes, and ours instruments the scheduler
(request events) and the tokenizer (the caller's ``traceparent``). ``SGLANG_PLUGINS`` selects which
plugins load (``SGLANG_PLUGINS=otel_llm`` loads only this one). By hand, in a process you control::

    from otel_llm.integrations.sglang import SGLangInstrumentor

    SGLangInstrumentor().instrument(model="my-model")

``opentelemetry-instrument`` also finds it (entry point ``opentelemetry_instrumentor``, name
``sglang_llm``). Where nothing set the OpenTelemetry providers, the scheduler process exports through
``otel_llm.configure()`` (``OTEL_*`` variables; OTLP JSON files without an endpoint).

A retraction (SGLang's preemption: the KV cache is freed, the request re-queued and recomputed from
prompt + generated tokens) becomes ``llm.preempted`` + ``llm.recompute`` spans, as in vLLM. The module
imports no SGLang code until ``instrument()`` runs, and ``instrument()`` returns at once without SGLang.
"""

from __future__ import annotations

from otel_llm.integrations.sglang.adapter import SGLangAdapter, finish_reason, to_monotonic
from otel_llm.integrations.sglang.instrumentor import SGLangInstrumentor

__all__ = ["SGLangAdapter", "SGLangInstrumentor", "finish_reason", "register", "to_monotonic"]


def register() -> None:
    """SGLang general-plugin entry point: instrument this SGLang process."""
    SGLangInstrumentor().instrument()
