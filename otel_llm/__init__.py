"""otel_llm: every request an LLM inference engine serves, as an OpenTelemetry trace and metrics.

The hook an engine calls (timestamps are ``time.monotonic()`` seconds; omitted means now)::

    from otel_llm import RequestTracker, configure

    telemetry = configure()                  # OTLP from OTEL_* env vars, else OTLP JSON files
    tracker = RequestTracker(model="my-model")
    tracker.queued("r1", prompt_tokens=12)
    tracker.scheduled(["r1"])
    tracker.tokens(["r1"])
    tracker.preempted(["r1"])
    tracker.finished("r1", reason="stop")
    telemetry.shutdown()
"""

from __future__ import annotations

from otel_llm._version import __version__
from otel_llm.tracker import RequestTracker

__all__ = ["RequestTracker", "__version__", "configure"]


def __getattr__(name: str):  # configure pulls in the OTLP exporters: import it on first use only
    if name == "configure":
        from otel_llm.setup import configure

        return configure
    raise AttributeError(f"module 'otel_llm' has no attribute {name!r}")
