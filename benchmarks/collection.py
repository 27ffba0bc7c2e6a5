"""Section 6: what one metric collection costs with otel_llm's histograms on the user's provider.

otel_llm's histograms join each collection of an SDK MeterProvider (``otel_llm.sdk_bridge``): one point
per attribute set, copied under the owner's lock. Measured: one ``InMemoryMetricReader`` collection of a
provider holding ``SETS`` distinct histogram attribute sets, written by otel_llm (``SETS / 10`` trackers,
each with its ten latency histograms, one model each), against the peer where the same number of
attribute sets live in ordinary SDK histograms on an otherwise identical provider. Same process, rounds
interleaved; the cost is per collection.
"""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from benchmarks.report import Measure
from benchmarks.timing import Round, compare, perf_ns
from otel_llm import RequestTracker

SETS = 1_000
PER_TRACKER = 10  # TTFT, TPOT, duration, queue, prefill, decode, inference, ITL, preempted, recompute


def _drive(tracker: RequestTracker, t0: float) -> None:
    """One request touching all ten histograms (a preemption gives preempted and recompute)."""
    tracker.queued("r", ts=t0)
    tracker.scheduled(["r"], ts=t0 + 0.01)
    tracker.tokens(["r"], ts=t0 + 0.02)
    tracker.preempted(["r"], ts=t0 + 0.03)
    tracker.scheduled(["r"], ts=t0 + 0.04)
    tracker.tokens(["r"], ts=t0 + 0.05)
    tracker.finished("r", ts=t0 + 0.06)


def ours(sets: int) -> tuple[Round, list[object]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    tracers = TracerProvider(shutdown_on_exit=False)
    trackers = [
        RequestTracker(tracer_provider=tracers, meter_provider=provider, model=f"model-{i}")
        for i in range(max(1, sets // PER_TRACKER))
    ]
    for i, tracker in enumerate(trackers):
        _drive(tracker, 100.0 + i)

    def run() -> tuple[int, int]:
        start = perf_ns()
        reader.get_metrics_data()
        return perf_ns() - start, 1

    return run, [provider, trackers]


def sdk_peer(sets: int) -> tuple[Round, list[object]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    meter = provider.get_meter("peer")
    histograms = [meter.create_histogram(f"peer.latency.{k}", unit="s") for k in range(PER_TRACKER)]
    for i in range(max(1, sets // PER_TRACKER)):
        for h in histograms:
            h.record(0.05, {"gen_ai.request.model": f"model-{i}"})

    def run() -> tuple[int, int]:
        start = perf_ns()
        reader.get_metrics_data()
        return perf_ns() - start, 1

    return run, [provider]


def handoff(sets: int) -> tuple[Round, list[object]]:
    """The bridge's share alone: building the histogram points of one collection."""
    import time

    from otel_llm.emit import meter_providers, sdk_bridge

    _, keep = ours(sets)
    sources = [s for owner in meter_providers.owners_for(keep[0]) for s in owner.histogram_sources()]
    state: list[dict] = [{}]

    def run() -> tuple[int, int]:
        seen: dict = {}
        start = perf_ns()
        sdk_bridge._metrics(sources, state[0], seen, False, time.time_ns())
        elapsed = perf_ns() - start
        state[0] = seen
        return elapsed, 1

    return run, keep


def run(quick: bool, rounds: int) -> list[Measure]:
    sets = 100 if quick else SETS
    mine, keep_mine = ours(sets)
    bridge, keep_bridge = handoff(sets)
    peer, keep_peer = sdk_peer(sets)
    timings = compare({"ours": mine, "bridge": bridge, "sdk": peer}, rounds)
    for keep in (keep_mine, keep_bridge, keep_peer):
        keep[0].shutdown()  # type: ignore[attr-defined]
    peer_name = "SDK histograms, same sets"
    return [
        Measure(
            "collect",
            f"one collection, {sets} histogram attribute sets ({sets // PER_TRACKER} trackers, their "
            "counters and gauges included)",
            "ns",
            timings["ours"].median_ns,
            {peer_name: timings["sdk"].median_ns},
            (timings["ours"].low_ns, timings["ours"].high_ns),
        ),
        Measure(
            "collect",
            f"of which the bridge's hand-off of {sets} histogram points",
            "ns",
            timings["bridge"].median_ns,
            {peer_name: timings["sdk"].median_ns},
            (timings["bridge"].low_ns, timings["bridge"].high_ns),
        ),
    ]
