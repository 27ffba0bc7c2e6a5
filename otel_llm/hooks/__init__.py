"""The hook side of otel_llm: what an engine calls while it serves requests, and the records it produces.

- ``tracker``: the five-call hook (``queued``, ``scheduled``, ``tokens``, ``preempted``, ``finished``), the
  KV hand-off calls and ``traceparent()``, with the per-step batch paths (the hot path) inline;
- ``inflight``: the registry of requests in flight, each request's own events, clamping, and closing
  as ``abandoned`` those that never finish;
- ``timeline``: one request's recorded timestamps; ``produce``: a finished timeline -> its record;
- ``identity``: trace ids fixed at ``queued``, parents, the one sampling decision; ``handoff``: the
  carrier of disaggregated serving; ``clock``: monotonic -> wall-clock through one offset;
- ``checks``, ``options``, ``attributes``, ``anomalies``: arguments checked, odd input counted;
- ``engine_state``, ``steps``, ``recompute``: the engine's own numbers, the steps behind the ``steps``
  detail level, what a rescheduling cost in tokens.

Only numbers are recorded here and nothing is emitted: each finished request leaves as one
``otel_llm.record.RequestRecord`` for the tracker's consumer. Nothing here imports ``otel_llm.emit`` or
``otel_llm.export``, nor the OpenTelemetry SDK.
"""
