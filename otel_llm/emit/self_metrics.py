"""What a tracker reports about itself: requests in flight by state, lifecycle anomalies by kind,
requests abandoned, and tail-sampling decisions.

Observable instruments, read in the metric reader's thread at collection time from the tracker's
figures (``otel_llm.record.Figures``: plain numbers the hook side keeps, with the anomalies the emit
side met counted among them) and from the tail sampler's decisions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from otel_llm import semconv as sc
from otel_llm.record import Figures

if TYPE_CHECKING:
    from otel_llm.emit.metrics import RequestMetrics
    from otel_llm.emit.sampling import TailSampler


def register(
    metrics: RequestMetrics,
    figures: Callable[[], Figures],
    tail: TailSampler | None,
    before_collection: Callable[[], None],
) -> None:
    """The tracker's own instruments on ``metrics``. ``figures``: the tracker's figures now;
    ``before_collection``: run first at each collection (a provider set since: its next collection has
    our histograms)."""
    if tail is not None:
        metrics.observe(
            sc.METRIC_SAMPLING_DECISIONS,
            sc.UNIT_DECISION,
            "Tail sampling decisions at finished(), by decision (keep / drop) and reason",
            tail.observe,
            counter=True,
        )

    def active() -> list[tuple[float, dict[str, Any]]]:
        before_collection()
        waiting, running, preempted = figures().states
        return [
            (waiting, {sc.LLM_REQUEST_STATE: sc.STATE_WAITING}),
            (running, {sc.LLM_REQUEST_STATE: sc.STATE_RUNNING}),
            (preempted, {sc.LLM_REQUEST_STATE: sc.STATE_PREEMPTED}),
        ]

    def anomalies() -> list[tuple[float, dict[str, Any]]]:
        return [(n, {sc.LLM_ANOMALY_KIND: kind}) for kind, n in figures().anomalies.items()]

    metrics.observe(sc.METRIC_ACTIVE, sc.UNIT_REQUEST, "Requests in flight by state", active, counter=False)
    metrics.observe(
        sc.METRIC_ANOMALIES, sc.UNIT_ANOMALY, "Lifecycle anomalies by kind", anomalies, counter=True
    )
    metrics.observe(
        sc.METRIC_ABANDONED,
        sc.UNIT_REQUEST,
        "Requests the tracker gave up on (never finished), closed with reason abandoned",
        lambda: [(figures().abandoned, {})],
        counter=True,
    )
