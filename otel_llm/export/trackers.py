"""The trackers that feed one export channel, and what each adds to a batch besides its records.

Each tracker gets a key when it binds (``add``); its records travel with that key. A batch tells the
export process, per tracker: its description the first time that process sees it, its figures (counters,
gauges, the per-step samples since the last batch), its step windows at detail ``steps``, and that it is
gone once the tracker was collected. Trackers are held weakly: one that is gone stops reporting, as in
process, and its description is kept so that its last records still go out.

``take_batch`` runs on the channel's sender thread, off the engine's thread; ``add`` on any thread.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, NamedTuple

from otel_llm.logs import warn_once
from otel_llm.record import Producer
from otel_llm.record.wire import figures_tuple, info_tuple

__all__ = ["BatchParts", "FeedingTrackers"]


class BatchParts(NamedTuple):
    """What a batch carries of the trackers, in the wire forms ``otel_llm.export.process`` reads."""

    greet: list[tuple[int, Any, Any]]  # (key, TrackerInfo's wire form, tail settings): new to the process
    figures: list[tuple[int, Any]]  # (key, Figures' wire form), the per-step samples drained
    windows: list[tuple[int, Any]]  # (key, StepWindow): the engine's own step spans
    gone: list[int]  # keys of the trackers collected since the previous batch


class FeedingTrackers:
    """The channel's trackers by key, and which of them the current export process knows."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # key -> (the tracker, weakly; tail settings; its TrackerInfo's wire form at binding time)
        self._entries: dict[int, tuple[weakref.ref[Any], Any, tuple[Any, ...]]] = {}
        self._keys = 0
        self._greeted: set[int] = set()  # keys the current export process knows

    def add(self, producer: Producer, tail: Any) -> int:
        """A tracker that feeds the channel; returns its key in the stream."""
        with self._lock:
            self._keys += 1
            key = self._keys
            self._entries[key] = (weakref.ref(producer), tail, info_tuple(producer.info))
        return key

    def new_process(self) -> None:
        """A new export process knows no tracker yet."""
        self._greeted = set()

    def active(self) -> bool:
        """Whether a tracker has something to report before any record: requests in flight, per-step
        samples, or anything the engine reported of itself."""
        with self._lock:
            producers = [ref() for ref, _, _ in self._entries.values()]
        return any(_reports(p.figures()) for p in producers if p is not None)

    def take_batch(self, everything: bool) -> BatchParts:
        """The trackers' part of the next batch; ``everything``: all step windows (a flush or shutdown).
        Trackers found gone are let go here; call ``sent`` once the batch is written."""
        live, gone = self._live()
        greeted = self._greeted
        # The tracker's description as it is now (its copy from binding time once it is gone).
        greet = [
            (k, info if p is None else info_tuple(p.info), _tail_tuple(t))
            for k, p, t, info in live
            if k not in greeted
        ]
        figures = [(k, figures_tuple(p.figures(drain=True))) for k, p, _, _ in live if p is not None]
        # The engine's own step spans (detail "steps"), taken here, off the engine's thread.
        windows = [(k, w) for k, p, _, _ in live if p is not None for w in _windows(p, everything)]
        return BatchParts(greet, figures, windows, gone)

    def sent(self, parts: BatchParts) -> None:
        """The export process now knows the trackers greeted in ``parts`` and has let the gone ones go."""
        self._greeted.update(k for k, _, _ in parts.greet)
        self._greeted.difference_update(parts.gone)

    def after_fork(self) -> None:
        """In a forked child: a fresh lock, and no export process knows any tracker yet."""
        self._lock = threading.Lock()
        self._greeted = set()

    def _live(self) -> tuple[list[tuple[int, Any, Any, Any]], list[int]]:
        """(key, tracker or None, tail settings, TrackerInfo's wire form) of the trackers this batch
        concerns, and the keys of those gone since the previous one (their emitters in the export process
        are let go once their last records are in)."""
        with self._lock:
            out, gone = [], []
            for key, (ref, tail, info) in list(self._entries.items()):
                producer = ref()
                if producer is None:
                    gone.append(key)
                    del self._entries[key]
                out.append((key, producer, tail, info))
        return out, gone


def _windows(producer: Any, final: bool) -> list[Any]:
    """``producer.step_windows(final)``, or none after one warning: a failure there must not stop the
    sender, which carries every record."""
    try:
        return producer.step_windows(final)
    except Exception:
        warn_once(
            "channel-step-windows", "otel_llm: the engine's step spans could not be taken", exc_info=True
        )
        return []


def _reports(f: Any) -> bool:
    """Whether a tracker's figures hold anything a metric would show."""
    return bool(
        sum(f.states)
        or f.anomalies
        or f.abandoned
        or f.itl
        or f.step_tokens
        or f.prompt_tokens
        or f.kv_cache_usage is not None
        or f.running is not None
        or f.waiting is not None
        or any(v is not None for v in f.counters.values())
    )


def _tail_tuple(tail: Any) -> Any:
    """Tail-sampling settings in their wire form (``otel_llm.emit.sampling.TailSampling``), or None."""
    return None if tail is None else (tail.ratio, tail.ttft_s, tail.e2e_s)
