"""What a tracker reports about itself: requests in flight by state, lifecycle anomalies by kind,
requests evicted, and tail-sampling decisions.

Observable instruments: the hooks only keep plain numbers in the in-flight registry
(``otel_llm.inflight``), read here in the metric reader's thread at collection time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from otel_llm import semconv as sc

if TYPE_CHECKING:
    from otel_llm.inflight import InFlight
    from otel_llm.metrics import RequestMetrics
    from otel_llm.sampling import TailSampler


def register(metrics: RequestMetrics, registry: InFlight, tail: TailSampler | None) -> None:
    """The tracker's own instruments on its ``metrics``; ``registry``: the tracker, read at collection."""
    if tail is not None:
        metrics.observe(
            sc.METRIC_SAMPLING_DECISIONS,
            sc.UNIT_DECISION,
            "Tail sampling decisions at finished(), by decision (keep / drop) and reason",
            tail.observe,
            counter=True,
        )

    def active() -> list[tuple[float, dict[str, Any]]]:
        metrics.resolve(registry._adopt_itl)  # a provider set since: its next collection has our histograms
        waiting, running, preempted = registry._states
        return [
            (waiting, {sc.LLM_REQUEST_STATE: sc.STATE_WAITING}),
            (running, {sc.LLM_REQUEST_STATE: sc.STATE_RUNNING}),
            (preempted, {sc.LLM_REQUEST_STATE: sc.STATE_PREEMPTED}),
        ]

    def anomalies() -> list[tuple[float, dict[str, Any]]]:
        with registry._lock:  # read when called: a forked child's registry has a new lock
            counts = list(registry._anomalies.counts.items())
        return [(n, {sc.LLM_ANOMALY_KIND: kind}) for kind, n in counts]

    metrics.observe(sc.METRIC_ACTIVE, sc.UNIT_REQUEST, "Requests in flight by state", active, counter=False)
    metrics.observe(
        sc.METRIC_ANOMALIES, sc.UNIT_ANOMALY, "Lifecycle anomalies by kind", anomalies, counter=True
    )
    metrics.observe(
        sc.METRIC_EVICTED,
        sc.UNIT_REQUEST,
        "Requests closed as evicted (never finished)",
        lambda: [(registry._evicted, {})],
        counter=True,
    )
