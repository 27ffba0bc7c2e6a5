"""otel_llm for vLLM V1: a trace with queue / prefill / decode / preemption spans for every request.

Switch it on in the process that runs vLLM's frontend (and, for request events, its engine core)::

    from otel_llm.integrations.vllm import VLLMInstrumentor

    VLLMInstrumentor().instrument()   # before the engine is built; model name from vLLM's config

Installed with otel_llm, vLLM also loads it as a general plugin (entry point group
``vllm.general_plugins``) in every vLLM process, and ``opentelemetry-instrument`` loads it through the
``opentelemetry_instrumentor`` entry point. Spans and metrics go to the global OpenTelemetry providers
unless ``tracer_provider=`` / ``meter_provider=`` or a ready ``tracker=`` are given; with
``OTEL_LLM_VLLM_CONFIGURE=1`` the plugin builds otel_llm's own providers from the ``OTEL_*`` variables
(``otel_llm.configure()``) in the process that serves requests, so ``vllm serve`` exports traces and
metrics with no code and no wrapper command.

How it works: vLLM's engine core timestamps each request's QUEUED / SCHEDULED / PREEMPTED events and
every batch of new tokens (``time.monotonic()`` seconds); the frontend's ``OutputProcessor`` receives them.
The instrumentor wraps that processor and replays the events into a RequestTracker (see ``adapter``), so
queue, prefill, decode and inference times equal vLLM's own ``FinishedRequestStats``. The module imports
no vLLM code until vLLM itself is imported.

Disaggregated prefill/decode (vLLM's KV connectors): a request's ``kv_transfer_params`` make it the
prefill or decode part of one trace across the two instances; the prefill instance's hand-off carrier
rides in the ``kv_transfer_params`` it returns, which the caller forwards (see ``disaggregated``).
"""

from __future__ import annotations

from otel_llm.integrations.vllm.adapter import VLLMAdapter
from otel_llm.integrations.vllm.instrumentor import VLLMInstrumentor
from otel_llm.integrations.vllm.reading import finish_reason_name, wall_to_monotonic

__all__ = ["VLLMAdapter", "VLLMInstrumentor", "finish_reason_name", "register", "wall_to_monotonic"]


def register() -> None:
    """vLLM general-plugin entry point, called in every vLLM process: instrument with the global
    OpenTelemetry providers, or with otel_llm's own when ``OTEL_LLM_VLLM_CONFIGURE=1``."""
    VLLMInstrumentor().instrument()
