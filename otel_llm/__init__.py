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

from typing import TYPE_CHECKING

from otel_llm import _moved
from otel_llm._version import __version__

if TYPE_CHECKING:
    from otel_llm.emit.sampling import TailSampling
    from otel_llm.setup import configure
    from otel_llm.tracker import RequestTracker

__all__ = ["RequestTracker", "TailSampling", "__version__", "configure"]

_moved.install()  # old names of the modules that moved to otel_llm.kit, with a DeprecationWarning


def __getattr__(name: str):  # imported on first use: `import otel_llm.integrations...` stays cheap
    if name == "RequestTracker":
        from otel_llm.tracker import RequestTracker

        return RequestTracker
    if name == "TailSampling":
        from otel_llm.emit.sampling import TailSampling

        return TailSampling
    if name == "configure":  # pulls in the OTLP exporters
        from otel_llm.setup import configure

        return configure
    raise AttributeError(f"module 'otel_llm' has no attribute {name!r}")
