"""Adapters that switch otel_llm on inside existing engines and libraries."""
