"""Section 4: bytes held per in-flight request, measured with tracemalloc.

K requests are queued, scheduled and run for N decode steps (one preemption and reschedule of each
halfway), and not finished; the memory traced after a full garbage collection, minus the memory traced
before the first ``queued``, divided by K, is the per-request cost. Request ids are made beforehand so
they are not counted. Objects a hook allocates once (the tracker's histograms, the peers' metric
families) exist before the baseline.
"""

from __future__ import annotations

import gc
import itertools
import tracemalloc
from typing import Any

from benchmarks.peers import BareLimit, NaiveOtel, VllmProm
from benchmarks.providers import discarding_providers
from benchmarks.report import Measure
from otel_llm import RequestTracker

_tags = itertools.count()


def in_flight_bytes(hook: Any, requests: int, tokens: int) -> float:
    tag = next(_tags)
    ids = [f"mem-{tag}-{i}" for i in range(requests)]
    warm = [f"warm-{tag}"]  # one request through every path first, so lazily built caches are baseline
    hook.queued(warm[0])
    hook.scheduled(warm)
    hook.tokens(warm)
    hook.tokens(warm)
    hook.finished(warm[0])
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for rid in ids:
            hook.queued(rid)
        hook.scheduled(ids)
        for step in range(tokens):
            hook.tokens(ids)
            if step == tokens // 2:
                hook.preempted(ids)
                hook.scheduled(ids)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    for rid in ids:
        hook.finished(rid)
    return (after - before) / requests


def run(quick: bool, rounds: int) -> list[Measure]:
    requests = 8 if quick else 64
    ours_p, naive_p = discarding_providers(), discarding_providers()
    try:
        out: list[Measure] = []
        for tokens in (16, 4096):
            hooks = {
                "ours": RequestTracker(
                    tracer_provider=ours_p.tracer_provider,
                    meter_provider=ours_p.meter_provider,
                    model="bench-model",
                ),
                "bare limit (every timestamp kept)": BareLimit(),
                "vLLM way (prometheus_client)": VllmProm(),
                "naive OpenTelemetry (live spans)": NaiveOtel(
                    naive_p.tracer_provider, naive_p.meter_provider
                ),
            }
            sizes = {name: in_flight_bytes(hook, requests, tokens) for name, hook in hooks.items()}
            ours = sizes.pop("ours")
            out.append(
                Measure(
                    "memory",
                    f"bytes per in-flight request, {tokens} output tokens, 1 preemption",
                    "B",
                    ours,
                    sizes,
                )
            )
        return out
    finally:
        ours_p.shutdown()
        naive_p.shutdown()
