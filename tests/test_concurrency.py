"""Real threads: an API thread queues and finishes while the engine thread runs the batch hooks."""

from __future__ import annotations

import queue
import threading
from collections import Counter

import pytest

from otel_llm import semconv as sc

# Every test here in both export modes: the engine's process, and the export process beside it.
pytestmark = pytest.mark.both_modes

N_API_THREADS = 3
PER_THREAD = 700
TOKENS_PER_REQUEST = 3


def test_every_request_exported_exactly_once_under_threads(harness):
    t = harness.tracker
    admitted: queue.SimpleQueue = queue.SimpleQueue()
    done: dict[str, queue.SimpleQueue] = {}
    stop = threading.Event()
    errors: list[BaseException] = []

    def api(k: int) -> None:
        try:
            mine = [f"t{k}-{i}" for i in range(PER_THREAD)]
            inbox: queue.SimpleQueue = queue.SimpleQueue()
            for rid in mine:
                done[rid] = inbox
                t.queued(rid, prompt_tokens=k + 1)
                admitted.put(rid)
            for _ in mine:
                rid = inbox.get(timeout=60)
                t.finished(rid, reason="length")
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    def engine() -> None:
        running: dict[str, int] = {}
        try:
            while not stop.is_set() or running:
                # Idle, it waits for a request as a scheduler loop does, rather than spin: a spinning
                # thread would take a core of two from the API threads and the export process.
                if not running:
                    try:
                        running[admitted.get(timeout=0.005)] = 0
                    except queue.Empty:
                        continue
                while True:
                    try:
                        running[admitted.get_nowait()] = 0
                    except queue.Empty:
                        break
                new = [r for r, n in running.items() if n == 0]
                if new:
                    t.scheduled(new)
                batch = list(running)
                if batch:
                    t.tokens(batch)
                    if len(batch) > 8:
                        t.preempted(batch[-1:])
                        t.scheduled(batch[-1:])
                for rid in batch:
                    running[rid] += 1
                    if running[rid] == TOKENS_PER_REQUEST:
                        del running[rid]
                        done[rid].put(rid)
        except BaseException as exc:
            errors.append(exc)

    engine_thread = threading.Thread(target=engine)
    api_threads = [threading.Thread(target=api, args=(k,)) for k in range(N_API_THREADS)]
    engine_thread.start()
    for th in api_threads:
        th.start()
    for th in api_threads:
        th.join(120)
    stop.set()
    engine_thread.join(120)
    assert not errors, errors
    # A thread still running would leave requests unfinished, and the count below would blame export.
    assert not any(th.is_alive() for th in (*api_threads, engine_thread)), "a thread did not end in 120 s"
    roots = harness.roots()
    ids = Counter(r.attributes[sc.LLM_REQUEST_ID] for r in roots)
    telemetry = getattr(harness, "telemetry", None)  # export mode process: where records went
    delivery = telemetry.channel.delivery() if telemetry is not None else None
    assert len(ids) == N_API_THREADS * PER_THREAD and set(ids.values()) == {1}, (
        f"{len(ids)} of {N_API_THREADS * PER_THREAD} requests exported, in flight {t.in_flight}; "
        f"delivery {delivery}"
    )
    for r in roots:
        k = int(r.attributes[sc.LLM_REQUEST_ID][1:].split("-")[0])
        assert r.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == k + 1  # not mixed up between requests
        assert r.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == TOKENS_PER_REQUEST
    assert t.in_flight == 0 and t.anomaly_counts == {}
    m = harness.metrics()
    assert sum(p.value for p in m[sc.METRIC_ACTIVE]) == 0
    assert m[sc.METRIC_REQUESTS][0].value == N_API_THREADS * PER_THREAD
