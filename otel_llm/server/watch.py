"""A pass-through hook that lets the HTTP layer see what the engine reports about its own requests.

The server needs three facts the token stream does not carry: the ``traceparent`` of the request's
``llm.request`` span (for the response headers, known once the engine has queued the request), the
finish reason, and the number of tokens produced. ``RequestWatch`` sits between the engine and the
real tracker, forwards every call unchanged, and notes those facts for the requests a handler watches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Watched:
    """What the engine has said about one request so far."""

    loop: asyncio.AbstractEventLoop
    queued: asyncio.Event = field(default_factory=asyncio.Event)  # set in the loop thread
    traceparent: str | None = None
    finish_reason: str | None = None
    completion_tokens: int = 0


class RequestWatch:
    """Forwards the five hook calls to ``inner`` (a RequestTracker, or None) and records the watched ones.

    Engine calls arrive from the event-loop thread (queued, aborts) and from the step worker thread
    (scheduled, tokens, finished); each note is a single attribute write, and ``queued`` wakes its
    waiter through the loop, so no lock is needed.
    """

    def __init__(self, inner: Any | None) -> None:
        self.inner = inner
        self._watched: dict[str, Watched] = {}

    def watch(self, request_id: str) -> Watched:
        """Start recording ``request_id``; call from the event loop before the request is submitted."""
        watched = Watched(asyncio.get_running_loop())
        self._watched[request_id] = watched
        return watched

    def forget(self, request_id: str) -> None:
        self._watched.pop(request_id, None)

    # --- the hook ---------------------------------------------------------------------------------

    def queued(self, request_id: Any, *, carrier: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        if self.inner is not None:
            self.inner.queued(request_id, carrier=carrier, **kwargs)
        watched = self._watched.get(request_id)
        if watched is not None:
            watched.traceparent = self.traceparent(request_id)
            watched.loop.call_soon_threadsafe(watched.queued.set)

    def scheduled(self, request_ids: Sequence[Any], ts: float | None = None) -> None:
        if self.inner is not None:
            self.inner.scheduled(request_ids, ts=ts)

    def tokens(
        self, request_ids: Sequence[Any], ts: float | None = None, counts: Sequence[int] | None = None
    ) -> None:
        if self.inner is not None:
            self.inner.tokens(request_ids, ts=ts, counts=counts)
        for i, rid in enumerate(request_ids):
            watched = self._watched.get(rid)
            if watched is not None:
                watched.completion_tokens += counts[i] if counts is not None else 1

    def preempted(self, request_ids: Sequence[Any], ts: float | None = None) -> None:
        if self.inner is not None:
            self.inner.preempted(request_ids, ts=ts)

    def finished(self, request_id: Any, **kwargs: Any) -> None:
        if self.inner is not None:
            self.inner.finished(request_id, **kwargs)
        watched = self._watched.get(request_id)
        if watched is not None:
            watched.finish_reason = kwargs.get("reason", "stop")

    def traceparent(self, request_id: Any) -> str | None:
        return self.inner.traceparent(request_id) if self.inner is not None else None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis)) if self.inner is not None else True
