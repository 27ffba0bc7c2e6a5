"""What vLLM's scheduler found cached when it rescheduled a preempted request, for the frontend.

The tracker's recompute figures (``otel_llm.recompute``) need, at each rescheduling, the tokens the
engine did not recompute. vLLM knows them in its engine core: right after ``Scheduler.schedule()``
re-admits a preempted request, the request's ``num_computed_tokens`` is what its local prefix cache and
a KV connector gave it, and the ``SchedulerOutput`` that ``schedule()`` returns (the message to the model
workers) lists them: ``scheduled_cached_reqs.resumed_req_ids`` with ``num_computed_tokens`` (the V2 model
runner's path puts resumed requests among ``scheduled_new_reqs`` instead). What reaches the frontend is
less: the request's next ``EngineCoreOutput`` carries only the SCHEDULED event and its timestamp
(``prefill_stats`` rides on a request's first output only).

So the figures can be read only where the engine core runs in the frontend's process (``LLM`` with
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, or a driver that runs the scheduler itself): the instrumentor wraps
``Scheduler.schedule`` and, while a frontend of this process is instrumented, keeps each resumed
request's figure under its SCHEDULED event's timestamp until the adapter replays that event. With the
engine core in its own process (the default, and always under ``vllm serve``) nothing is kept and the
reschedulings carry no figures; carrying them there would take a field on vLLM's SCHEDULED event or
output, such as ``num_computed_tokens`` of a resumed request.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

# Requests with a figure not replayed yet, at most: an abort or an eviction may leave a figure behind.
MAX_REQUESTS = 4096


def resumed(scheduler: Any, output: Any) -> Iterator[tuple[str, int]]:
    """(request id, tokens found cached) of every preempted request ``output`` re-admits."""
    cached_reqs = getattr(output, "scheduled_cached_reqs", None)
    resumed_ids = getattr(cached_reqs, "resumed_req_ids", None)
    if resumed_ids:
        for request_id, computed in zip(cached_reqs.req_ids, cached_reqs.num_computed_tokens):
            if request_id in resumed_ids:
                yield request_id, computed
    requests = getattr(scheduler, "requests", {})
    for new in getattr(output, "scheduled_new_reqs", ()):  # the V2 model runner's resumed requests
        request = requests.get(getattr(new, "req_id", None))
        if getattr(request, "num_preemptions", 0) > 0:
            yield new.req_id, new.num_computed_tokens


class Reschedulings:
    """Per request, {SCHEDULED timestamp: tokens found cached} of its reschedulings not yet replayed.

    Written by the scheduler's thread, read by the frontend's (the same thread for ``LLM``; a lock
    either way). Bounded by ``MAX_REQUESTS`` (oldest dropped)."""

    def __init__(self) -> None:
        self._figures: dict[str, dict[float, int]] = {}
        self._lock = threading.Lock()

    def record(self, scheduler: Any, output: Any) -> None:
        """Keep the figures of the reschedulings in one ``schedule()`` result."""
        found = []
        for request_id, cached in resumed(scheduler, output):
            events = getattr(scheduler.requests.get(request_id), "events", None)
            last = events[-1] if events else None
            if getattr(getattr(last, "type", None), "name", None) != "SCHEDULED" or not isinstance(
                cached, int
            ):
                continue  # no event to key it by (stats logging off), or not a count
            found.append((request_id, last.timestamp, cached))
        if not found:
            return
        with self._lock:
            figures = self._figures
            for request_id, ts, cached in found:
                figures.setdefault(request_id, {})[ts] = cached
            while len(figures) > MAX_REQUESTS:
                del figures[next(iter(figures))]

    def take(self, request_id: str, ts: float) -> int | None:
        """The cached tokens of the request's rescheduling at ``ts`` (once), or None when unknown."""
        if not self._figures:
            return None
        with self._lock:
            by_ts = self._figures.get(request_id)
            if by_ts is None:
                return None
            cached = by_ts.pop(ts, None)
            if not by_ts:
                del self._figures[request_id]
            return cached

    def forget(self, request_id: str) -> None:
        """The request ended: drop what is left of it."""
        if self._figures:
            with self._lock:
                self._figures.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._figures)
