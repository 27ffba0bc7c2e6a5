"""One hook for the reference engine, a ``RequestTracker`` per GenAI operation behind it.

``gen_ai.operation.name`` is an attribute of every span and metric point of a tracker (the GenAI
conventions want it on the ``gen_ai.server.*`` metrics too), so a server that answers both
``/v1/completions`` (``text_completion``) and ``/v1/chat/completions`` (``chat``) needs a tracker for
each, as the vLLM integration has. The engine knows one hook: this object takes its calls, sends a
request's calls to the tracker of its operation (told by its request id, which the server chooses), and
a step's ``batch()`` to every tracker, since a request's stall may be caused by a request of the other
operation. ``engine_state()`` (the engine's own figures, one set per step) goes to the first tracker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

OPERATION_CHAT = "chat"
OPERATION_TEXT_COMPLETION = "text_completion"
CHAT_ID_PREFIX = "chatcmpl-"  # what the server's chat requests' ids start with (OpenAI's spelling)


def operation_of(request_id: str) -> str:
    """The GenAI operation of a request of ``otel-llm serve``, by its id."""
    return OPERATION_CHAT if str(request_id).startswith(CHAT_ID_PREFIX) else OPERATION_TEXT_COMPLETION


class OperationTrackers:
    """The hook of ``LLMEngine(tracker=...)``, backed by ``make(operation)`` trackers (one per operation
    in ``operations``, made now; the first takes ``engine_state()`` and lends its clock to the engine)."""

    def __init__(
        self,
        make: Callable[[str], Any],
        operations: Iterable[str] = (OPERATION_TEXT_COMPLETION, OPERATION_CHAT),
        operation: Callable[[str], str] = operation_of,
    ) -> None:
        self.trackers = {name: make(name) for name in operations}
        self._first = next(iter(self.trackers.values()))
        self._operation = operation
        self._of: dict[Any, Any] = {}  # request id -> its tracker, while the engine holds the request
        self._lock = threading.Lock()

    @property
    def clock(self) -> Any:
        return self._first.clock

    def _tracker(self, request_id: Any) -> Any:
        with self._lock:
            tracker = self._of.get(request_id)
        return tracker if tracker is not None else self._first

    def _split(
        self, request_ids: Sequence[Any], per_request: Sequence[int] | None
    ) -> list[tuple[Any, list, Any]]:
        """``(tracker, its ids, their values of per_request or None)`` for each tracker with ids here."""
        parts: dict[int, tuple[Any, list, list | None]] = {}
        for i, rid in enumerate(request_ids):
            tracker = self._tracker(rid)
            part = parts.setdefault(id(tracker), (tracker, [], [] if per_request is not None else None))
            part[1].append(rid)
            if per_request is not None:
                part[2].append(per_request[i])  # type: ignore[union-attr]
        return list(parts.values())

    def queued(self, request_id: Any, **kwargs: Any) -> None:
        tracker = self.trackers.get(self._operation(request_id), self._first)
        with self._lock:
            self._of[request_id] = tracker
        tracker.queued(request_id, **kwargs)

    def scheduled(
        self, request_ids: Sequence[Any], ts: float | None = None, cached_tokens: Sequence[int] | None = None
    ) -> None:
        ts = time.monotonic() if ts is None else ts  # one instant for every tracker
        for tracker, ids, cached in self._split(request_ids, cached_tokens):
            tracker.scheduled(ids, ts=ts, cached_tokens=cached)

    def tokens(
        self, request_ids: Sequence[Any], ts: float | None = None, counts: Sequence[int] | None = None
    ) -> None:
        ts = time.monotonic() if ts is None else ts
        for tracker, ids, part in self._split(request_ids, counts):
            tracker.tokens(ids, ts=ts, counts=part)

    def preempted(self, request_ids: Sequence[Any], ts: float | None = None) -> None:
        ts = time.monotonic() if ts is None else ts
        for tracker, ids, _ in self._split(request_ids, None):
            tracker.preempted(ids, ts=ts)

    def batch(
        self, scheduled: Mapping[Any, int], ts: float | None = None, recompute: Collection[Any] | None = None
    ) -> None:
        ts = time.monotonic() if ts is None else ts
        for tracker in self.trackers.values():
            tracker.batch(scheduled, ts=ts, recompute=recompute)

    def engine_state(self, **kwargs: Any) -> None:
        self._first.engine_state(**kwargs)

    def finished(self, request_id: Any, **kwargs: Any) -> None:
        tracker = self._tracker(request_id)
        with self._lock:
            self._of.pop(request_id, None)
        tracker.finished(request_id, **kwargs)

    def kv_sent(self, request_id: Any, **kwargs: Any) -> None:
        self._tracker(request_id).kv_sent(request_id, **kwargs)

    def kv_received(self, request_id: Any, **kwargs: Any) -> None:
        self._tracker(request_id).kv_received(request_id, **kwargs)

    def handoff_carrier(self, request_id: Any) -> dict[str, str] | None:
        return self._tracker(request_id).handoff_carrier(request_id)

    def traceparent(self, request_id: Any) -> str | None:
        return self._tracker(request_id).traceparent(request_id)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return all([t.force_flush(timeout_millis) for t in self.trackers.values()])
