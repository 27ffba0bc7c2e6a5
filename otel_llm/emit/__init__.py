"""The emit side of otel_llm: records in, spans and metric values out.

- ``pipeline``: ``Emitter``, the consumer of one tracker's records: intervals, keep or drop, spans,
  metric values, in this process or in an export process (``otel_llm.export.process``);
- ``intervals``: a record's durations (vLLM's rules); ``sampling``: tail sampling; ``span_data``: what
  ``llm.request`` carries; ``spans`` / ``sdk_spans`` / ``preset``: the spans, straight to an SDK
  provider's processors or through any tracer;
- ``metrics``, ``recorders``, ``histogram``, ``sdk_bridge``, ``observables``, ``meter_providers``: the
  metric values, pre-aggregated and handed to every reader of the provider;
- ``engine_metrics``, ``self_metrics``, ``recompute``, ``steps``: what the tracker's figures and records
  say of the engine, of the tracker itself, of preemptions' work and of engine steps.

Nothing here imports ``otel_llm.hooks``: it reads ``otel_llm.record`` only.
"""
