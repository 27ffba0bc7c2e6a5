"""Section 3: finished requests per second through ``otel_llm.configure()`` to a real OTLP gRPC receiver
on loopback (a separate process, like a collector), the fraction of spans dropped on the way, and a
check that inter-token latency arrives as an exact histogram.

The workload is a simulated engine (no model): 64 slots of continuous batching, each request 32 output
tokens, one preemption every 16 steps, with the real clock. Spans produced are counted by a span
processor added to the configured provider (at span end); spans received are counted by the receiver
after a flush. The exact-histogram check records every inter-token gap, derived independently from the
workload's own timestamps, into a plain SDK histogram with the same bounds and compares bucket counts
with what the receiver got.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanProcessor

from benchmarks.report import Measure
from otel_llm import RequestTracker
from otel_llm import semconv as sc

SLOTS = 64
TOKENS = 32
PREEMPT_EVERY = 16
WAIT_S = 30.0


class CountingProcessor(SpanProcessor):
    """Counts spans as they end: the spans produced."""

    def __init__(self) -> None:
        self.ended = 0

    def on_end(self, span: Any) -> None:
        self.ended += 1


class Receiver:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.receiver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        with suppress(BrokenPipeError, ValueError):
            self.ask("quit")
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@contextmanager
def otlp_env(port: int) -> Iterator[None]:
    wanted = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_METRIC_EXPORT_INTERVAL": "60000",  # one export at flush: the check reads the final totals
    }
    saved = {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}
    for k in saved:
        del os.environ[k]
    os.environ.update(wanted)
    try:
        yield
    finally:
        for k in wanted:
            os.environ.pop(k, None)
        os.environ.update(saved)


def simulate(tracker: Any, requests: int, control: Any) -> float:
    """Continuous batching of ``requests`` through ``tracker``; returns the loop's seconds.

    ``control(gap_s)`` is called for every inter-token gap, computed here from this loop's timestamps.
    """
    mono = time.monotonic
    waiting = [f"e2e-{i}" for i in range(requests)]
    waiting.reverse()
    running: dict[str, int] = {}  # id -> tokens produced
    last: dict[str, float] = {}
    preempted: list[str] = []  # evicted last step, rescheduled this step
    resumed: dict[str, int] = {}  # tokens of each evicted request
    step = 0
    start = time.perf_counter()
    while waiting or running or preempted:
        ts = mono()
        new = preempted[:]
        preempted.clear()
        for rid in new:
            running[rid] = resumed.pop(rid)
        while waiting and len(running) < SLOTS:
            rid = waiting.pop()
            tracker.queued(rid, ts=ts)
            running[rid] = 0
            new.append(rid)
        if new:
            tracker.scheduled(new, ts=ts)
        ids = list(running)
        ts = mono()
        tracker.tokens(ids, ts=ts)
        for rid in ids:
            before = last.get(rid)
            if before is not None:
                control(ts - before)
            last[rid] = ts
            running[rid] += 1
        for rid in [r for r in ids if running[r] >= TOKENS]:
            del running[rid], last[rid]
            tracker.finished(rid, ts=ts)
        step += 1
        if step % PREEMPT_EVERY == 0 and running:
            victim = next(iter(running))
            tracker.preempted([victim], ts=ts)
            resumed[victim] = running.pop(victim)
            preempted.append(victim)
    return time.perf_counter() - start


def run(quick: bool, rounds: int) -> list[Measure]:
    import otel_llm

    requests = 200 if quick else 6_000
    receiver = Receiver()
    try:
        with otlp_env(receiver.port):
            telemetry = otel_llm.configure(service_name="otel-llm-bench", set_global=False)
        counter = CountingProcessor()
        telemetry.tracer_provider.add_span_processor(counter)
        tracker = RequestTracker(
            tracer_provider=telemetry.tracer_provider,
            meter_provider=telemetry.meter_provider,
            model="bench-model",
        )
        reader = InMemoryMetricReader()
        control_provider = MeterProvider(metric_readers=[reader])
        control = control_provider.get_meter("control").create_histogram(
            "control.itl", explicit_bucket_boundaries_advisory=sc.BUCKETS_ITL
        )
        gaps: list[float] = []
        elapsed = simulate(tracker, requests, gaps.append)  # gaps kept, recorded after the timed loop
        for gap in gaps:
            control.record(gap)
        telemetry.force_flush(timeout_s=WAIT_S)
        deadline = time.monotonic() + WAIT_S
        received = int(receiver.ask("spans"))
        # Spans the pipeline dropped (counted by otel_llm, e.g. a full batch queue) will never arrive.
        while received + telemetry.drops.total("spans") < counter.ended and time.monotonic() < deadline:
            time.sleep(0.2)
            received = int(receiver.ask("spans"))
        itl = json.loads(receiver.ask("itl") or "{}")
        telemetry.shutdown()
    finally:
        receiver.close()
    expected = _control_counts(reader)
    exact = bool(itl) and itl.get("bucket_counts") == expected and itl.get("count") == sum(expected)
    produced = counter.ended
    note = f"{requests} requests, {produced} spans produced, {received} received"
    return [
        Measure("e2e", "finished requests per second", "req/s", requests / elapsed, note=note),
        Measure("e2e", "fraction of spans dropped", "fraction", max(0.0, 1 - received / max(produced, 1))),
        Measure(
            "e2e",
            "inter-token latency samples in the exported histogram",
            "count",
            float(itl.get("count", 0)),
            {"every gap recorded in an SDK histogram": float(sum(expected))},
            note="bucket counts identical" if exact else "bucket counts DIFFER",
        ),
    ]


def _control_counts(reader: InMemoryMetricReader) -> list[int]:
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == "control.itl":
                    return list(metric.data.data_points[0].bucket_counts)
    return []
