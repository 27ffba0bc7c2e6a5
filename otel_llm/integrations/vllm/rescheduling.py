"""What vLLM's scheduler found cached when it rescheduled a preempted request, for the frontend.

The tracker's recompute figures (``otel_llm.recompute``) need, at each rescheduling, the tokens the
engine did not recompute. vLLM knows them in its engine core: right after ``Scheduler.schedule()``
re-admits a preempted request, the request's ``num_computed_tokens`` is what its local prefix cache and
a KV connector gave it, and the ``SchedulerOutput`` that ``schedule()`` returns (the message to the model
workers) lists them: ``scheduled_cached_reqs.resumed_req_ids`` with ``num_computed_tokens`` (the V2 model
runner's path puts resumed requests among ``scheduled_new_reqs`` instead). What reaches the frontend is
less: the request's next ``EngineCoreOutput`` carries only the SCHEDULED event and its timestamp
(``prefill_stats`` rides on a request's first output only).

Where the engine core runs in the frontend's process (``LLM`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
or a driver that runs the scheduler itself) the instrumentor wraps ``Scheduler.schedule`` and, while a
frontend of this process is instrumented, keeps each resumed request's figure under its SCHEDULED
event's timestamp until the adapter replays that event. With the engine core in its own process (the
default, and always under ``vllm serve``) the same wrapper runs there and sends the figures to the
frontend (``engine_core_figures``), whose ``Reschedulings`` reads them in when a replayed rescheduling
finds none yet.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

_log = logging.getLogger(__name__)

# Requests with a figure not replayed yet, at most: an abort or an eviction may leave a figure behind.
MAX_REQUESTS = 4096


def resumed(scheduler: Any, output: Any) -> Iterator[tuple[str, int]]:
    """(request id, tokens found cached) of every preempted request ``output`` re-admits."""
    cached_reqs: Any = getattr(output, "scheduled_cached_reqs", None)
    resumed_ids = getattr(cached_reqs, "resumed_req_ids", None)
    if resumed_ids:
        req_ids, computed = cached_reqs.req_ids, cached_reqs.num_computed_tokens
        # list.index per re-admitted request, not a walk over the whole batch in Python: a step
        # re-admits a few requests of a batch of hundreds.
        found = []
        for request_id in resumed_ids:
            try:
                found.append(req_ids.index(request_id))
            except ValueError:
                continue
        for at in sorted(found):
            yield req_ids[at], computed[at]
    requests = getattr(scheduler, "requests", {})
    for new in getattr(output, "scheduled_new_reqs", ()):  # the V2 model runner's resumed requests
        request = requests.get(getattr(new, "req_id", None))
        if getattr(request, "num_preemptions", 0) > 0:
            yield new.req_id, new.num_computed_tokens


def rescheduled(scheduler: Any, output: Any) -> list[tuple[str, float, int, int]]:
    """(request id, SCHEDULED timestamp, tokens found cached, client index) of every rescheduling in one
    ``schedule()`` result that vLLM timestamped (with stats logging off there is no event to key it by)."""
    found = []
    requests = getattr(scheduler, "requests", {})
    for request_id, cached in resumed(scheduler, output):
        request = requests.get(request_id)
        events = getattr(request, "events", None)
        last: Any = events[-1] if events else None
        if getattr(getattr(last, "type", None), "name", None) != "SCHEDULED" or not isinstance(cached, int):
            continue
        client = getattr(request, "client_index", 0)
        found.append((request_id, last.timestamp, cached, client if isinstance(client, int) else 0))
    return found


class Reschedulings:
    """Per request, {SCHEDULED timestamp: tokens found cached} of its reschedulings not yet replayed.

    Written by the scheduler's thread, read by the frontend's (the same thread for ``LLM``; a lock
    either way). Bounded by ``MAX_REQUESTS`` (oldest dropped)."""

    def __init__(self) -> None:
        self._figures: dict[str, dict[float, int]] = {}
        self._lock = threading.Lock()
        # Where figures from an engine core in another process wait (engine_core_figures): read when a
        # rescheduling finds no figure here.
        self.sources: list[Callable[[], list[tuple[str, float, int]]]] = []
        self.missing = 0  # reschedulings replayed with no figure from anywhere
        self._warned = False

    def record(self, scheduler: Any, output: Any) -> None:
        """Keep the figures of the reschedulings in one ``schedule()`` result."""
        found = rescheduled(scheduler, output)
        if found:
            self.add((request_id, ts, cached) for request_id, ts, cached, _ in found)

    def add(self, figures: Iterable[tuple[str, float, int]]) -> None:
        """Keep (request id, SCHEDULED timestamp, cached tokens) figures until taken."""
        with self._lock:
            kept = self._figures
            for request_id, ts, cached in figures:
                kept.setdefault(request_id, {})[ts] = cached
            while len(kept) > MAX_REQUESTS:
                del kept[next(iter(kept))]

    def take(self, request_id: str, ts: float) -> int | None:
        """The cached tokens of the request's rescheduling at ``ts`` (once), or None when unknown."""
        cached = self._take(request_id, ts) if self._figures else None
        if cached is None and self.sources:
            for source in self.sources:
                figures = source()
                if figures:
                    self.add(figures)
            cached = self._take(request_id, ts) if self._figures else None
        return cached

    def take_rescheduling(self, request_id: str, ts: float) -> int | None:
        """``take()`` for a SCHEDULED event the frontend knows is a rescheduling: a miss is counted and,
        the first time, said (its llm.recompute span then carries no token figures)."""
        cached = self.take(request_id, ts)
        if cached is None:
            self.missing += 1
            if not self._warned:
                self._warned = True
                _log.warning(
                    "otel_llm: vLLM's engine core did not say what it found cached when it rescheduled "
                    "request %s (otel_llm must be installed where the engine core runs, on this machine, "
                    "and vLLM's stats logging on); such llm.recompute spans carry no token figures",
                    request_id,
                )
        return cached

    def _take(self, request_id: str, ts: float) -> int | None:
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
