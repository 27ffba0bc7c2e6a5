"""An asyncio API loop on its own thread queues and finishes requests while the engine thread calls the
batch hooks at a high rate: every request exported exactly once, with its own numbers (not mixed up)."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import Counter

from otel_llm import semconv as sc

REQUESTS = 1500
CONCURRENCY = 64  # requests the API loop has in flight at once


def tokens_for(i: int) -> int:
    return 1 + i % 5


def test_asyncio_api_loop_and_engine_thread(harness) -> None:
    t = harness.tracker
    admitted: queue.SimpleQueue = queue.SimpleQueue()  # API loop -> engine thread
    api_done = threading.Event()
    errors: list[BaseException] = []

    async def handle(i: int, loop: asyncio.AbstractEventLoop, gate: asyncio.Semaphore) -> None:
        async with gate:
            rid = f"req-{i}"
            finished: asyncio.Future = loop.create_future()
            t.queued(rid, prompt_tokens=i % 97 + 1, attributes={"client.index": i})
            admitted.put((rid, tokens_for(i), loop, finished))
            reason = await finished  # set by the engine thread through call_soon_threadsafe
            t.finished(rid, reason=reason)

    async def api() -> None:
        loop = asyncio.get_running_loop()
        gate = asyncio.Semaphore(CONCURRENCY)
        await asyncio.gather(*(handle(i, loop, gate) for i in range(REQUESTS)))

    def api_thread() -> None:
        try:
            asyncio.run(api())
        except BaseException as exc:
            errors.append(exc)
        finally:
            api_done.set()

    def engine() -> None:
        running: dict[str, list] = {}
        try:
            while not (api_done.is_set() and not running and admitted.empty()):
                new = []
                while True:
                    try:
                        rid, want, loop, fut = admitted.get_nowait()
                    except queue.Empty:
                        break
                    running[rid] = [0, want, loop, fut]
                    new.append(rid)
                if new:
                    t.scheduled(new)
                if not running:
                    continue
                batch = list(running)
                t.tokens(batch)
                for rid in batch:
                    state = running[rid]
                    state[0] += 1
                    if state[0] == state[1]:
                        del running[rid]
                        reason = "length" if state[1] == 5 else "stop"
                        state[2].call_soon_threadsafe(state[3].set_result, reason)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=api_thread), threading.Thread(target=engine)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads), "a thread did not finish"
    assert not errors, errors

    roots = harness.roots()
    ids = Counter(r.attributes[sc.LLM_REQUEST_ID] for r in roots)
    assert len(ids) == REQUESTS and set(ids.values()) == {1}  # none lost, none twice
    for r in roots:
        i = int(r.attributes[sc.LLM_REQUEST_ID].split("-")[1])
        assert r.attributes["client.index"] == i
        assert r.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == i % 97 + 1
        assert r.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == tokens_for(i)
        expected = "length" if tokens_for(i) == 5 else "stop"
        assert tuple(r.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == (expected,)
    assert t.in_flight == 0 and t.anomaly_counts == {}
    m = harness.metrics()
    assert sum(p.value for p in m[sc.METRIC_REQUESTS]) == REQUESTS
