"""The engine side's account of the records it hands to export processes: sent, done, delivered or lost.

Records are numbered from 1 as they are written to an export process (``sent``). The export process
answers with ``done``, the number of the last record all of whose spans have left its span pipeline, and
with its pipeline's counts of delivered and lost spans and metric points. When an export process ends,
the records sent and not done are counted lost, and its counts are kept beside its successor's, so the
totals never go back.

Records lost on the engine's side, by reason:

- ``queue_full``: the channel's queue was full when a request finished;
- ``export_process_exited``: sent to an export process that died before it finished them;
- ``unsent_at_shutdown``: not through the export process when shutdown's time ran out.

``FlushRequests`` numbers the flushes callers ask for and wakes them as the export process answers.
Every method here is safe from any thread; deadlines are ``time.monotonic()`` seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "PROCESS_EXITED",
    "QUEUE_FULL",
    "UNSENT_AT_SHUTDOWN",
    "DeliveryLedger",
    "FlushRequests",
]

QUEUE_FULL = "queue_full"
PROCESS_EXITED = "export_process_exited"
UNSENT_AT_SHUTDOWN = "unsent_at_shutdown"
SIGNALS = ("spans", "metric_points")
# The export process's count of its exporters' warnings and errors (counted there, not written): a plain
# number in its delivery report, beside the per-signal (delivered, {reason: lost}, ended) rows.
EXPORTER_LINES = "exporter_lines"


class DeliveryLedger:
    """Records sent, done and lost, and what the export processes delivered, over all their restarts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent = 0  # records written to export processes, numbered from 1 (the sender thread writes it)
        self.done = 0  # the last record an export process finished
        self._losses = {QUEUE_FULL: 0, PROCESS_EXITED: 0, UNSENT_AT_SHUTDOWN: 0}
        self._ended: dict[str, Any] = {}  # delivery totals of the export processes that ended
        self._current: dict[str, Any] = {}  # the running one's, as it last reported them

    def lose(self, reason: str, records: int = 1) -> None:
        """``records`` lost on this side for ``reason`` (one of the three above)."""
        with self._lock:
            self._losses[reason] += records

    def losses(self) -> dict[str, int]:
        """Records lost on this side so far, by reason."""
        with self._lock:
            return dict(self._losses)

    def count_sent(self, records: int) -> None:
        """``records`` more were written whole to the export process's pipe."""
        with self._lock:
            self.sent += records

    def process_started(self) -> None:
        """A new export process: every earlier record was done or counted lost."""
        with self._lock:
            self.done = self.sent

    def acknowledged(self, done: int, delivery: dict[str, Any]) -> None:
        """The export process finished the records up to ``done`` and reports its pipeline's counts."""
        with self._lock:
            self.done = max(self.done, done)
            self._current = delivery

    def process_exited(self, unsent: int) -> int:
        """The export process is gone: the records sent and not done, and ``unsent`` records of a message
        it did not take, count as ``export_process_exited``; its counts join the ended ones. Returns how
        many records were lost."""
        with self._lock:
            lost = self.sent - self.done + unsent
            self._losses[PROCESS_EXITED] += lost
            self.done = self.sent
            for signal, part in self._current.items():
                if signal == EXPORTER_LINES:
                    self._ended[signal] = self._ended.get(signal, 0) + part
                else:
                    self._ended[signal] = _add_row(self._ended.get(signal, (0, {}, 0)), part)
            self._current = {}
        return lost

    def unsent_at_shutdown(self, queued: int) -> None:
        """Shutdown's time ran out: the records sent and not done, and ``queued`` never sent, are lost."""
        with self._lock:
            self._losses[UNSENT_AT_SHUTDOWN] += self.sent - self.done + queued
            self.done = self.sent

    def delivery(self) -> dict[str, Any]:
        """What the export processes delivered and lost, by signal: ``{"spans": (delivered, {reason: n},
        ended), "metric_points": (...)}``; ``requests``: (records done, losses on this side);
        ``exporter_lines``: the exporters' warnings and errors counted there."""
        with self._lock:
            out: dict[str, Any] = {}
            for signal in SIGNALS:
                total: tuple[int, dict[str, int], int] = (0, {}, 0)
                for part in (self._ended.get(signal), self._current.get(signal)):
                    if part is not None:
                        total = _add_row(total, part)
                out[signal] = total
            out["requests"] = (self.done, dict(self._losses))
            out[EXPORTER_LINES] = self._ended.get(EXPORTER_LINES, 0) + self._current.get(EXPORTER_LINES, 0)
            return out


def _add_row(total: tuple[int, dict[str, int], int], part: Any) -> tuple[int, dict[str, int], int]:
    """Two rows of delivery reports added: ``(delivered, {reason: lost}, ended)``."""
    lost_by = dict(total[1])
    for reason, n in part[1].items():
        lost_by[reason] = lost_by.get(reason, 0) + n
    return (total[0] + part[0], lost_by, total[2] + part[2])


class FlushRequests:
    """The flushes callers asked for (numbered from 1), how far the export process answered, and whether
    its last answer said it exported everything in time."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._wanted = 0  # the last flush a caller asked for
        self._sent = 0  # the last one sent to the export process (the sender thread writes it)
        self._answered = 0  # the last one the export process answered
        self._ok = True

    @property
    def pending(self) -> bool:
        """A caller asked for a flush not yet sent to the export process."""
        return self._wanted > self._sent

    @property
    def awaited(self) -> bool:
        """A flush was sent to the export process and it has not answered yet."""
        return self._answered < self._sent

    def ask(self) -> int:
        """A caller wants a flush; returns its number, for ``wait``."""
        with self._cond:
            self._wanted += 1
            return self._wanted

    def take(self) -> int:
        """The sender sends the flushes asked for so far as one; returns the number to send."""
        with self._cond:
            self._sent = self._wanted
            return self._sent

    def answered(self, flush: int, in_time: bool) -> None:
        """The export process answered flush number ``flush`` (and every one before it)."""
        with self._cond:
            self._answered = max(self._answered, flush)
            self._ok = bool(in_time)
            self._cond.notify_all()

    def wake_all(self) -> None:
        """Waiters look again (the export process or the sender thread went away)."""
        with self._cond:
            self._cond.notify_all()

    def wait(self, flush: int, deadline: float, sending: Callable[[], bool]) -> bool:
        """Until flush number ``flush`` is answered, the ``deadline`` passes or ``sending()`` turns False
        (the sender thread stopped); True when it was answered and in time."""
        with self._cond:
            while self._answered < flush:
                left = deadline - time.monotonic()
                if left <= 0 or not sending():
                    return False
                self._cond.wait(left)
            return self._ok
