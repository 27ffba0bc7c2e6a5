"""Adapters that switch otel_llm on inside existing engines and libraries.

Each is a subpackage or module of its own, imported by name: ``otel_llm.integrations.vllm``,
``otel_llm.integrations.sglang``, ``otel_llm.integrations.transformers``.
"""

__all__: list[str] = []  # nothing here itself: import the integration you use by its name
