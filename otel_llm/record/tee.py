"""One tracker's records to two consumers: the one that exports them, and a second that only looks.

A ``Tee`` is the tracker's consumer; every record goes to ``primary`` and then to ``secondary``. Only
``primary`` steers the tracker: it chooses the per-step recorders (the secondary's choice is ignored, so
its metrics get no inter-token samples), answers ``would_keep`` and has the tracker count its troubles.
The demo uses one to draw the waterfall from spans built in its own process while the export process
exports them (``otel_llm.kit.commands.demo``).
"""

from __future__ import annotations

import threading
from typing import Any

from otel_llm.record import (
    Figures,
    Producer,
    RecordConsumer,
    RequestRecord,
    StepRecorder,
    StepWindow,
    TrackerInfo,
)


class _Onlooker:
    """The producer as the secondary consumer sees it: it may read, not steer."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self.info: TrackerInfo = producer.info

    @property
    def lock(self) -> threading.Lock:
        return self._producer.lock

    def figures(self, drain: bool = False) -> Figures:
        return self._producer.figures()  # never drains: the samples are the primary's

    def use_recorders(self, itl: StepRecorder | None, step_tokens: StepRecorder | None) -> None:
        """Ignored: the primary consumer's recorders stay."""

    def note(self, kind: str, request_id: Any) -> None:
        """Ignored: the primary consumer's troubles are the tracker's to count."""

    def step_windows(self, final: bool = False) -> list[StepWindow]:
        """None: the engine's step windows are the primary consumer's to take."""
        return []


class Tee:
    """``primary`` and ``secondary`` as one ``otel_llm.record.RecordConsumer``."""

    def __init__(self, primary: RecordConsumer, secondary: RecordConsumer) -> None:
        self.primary = primary
        self.secondary = secondary

    def bind(self, producer: Producer) -> None:
        self.primary.bind(producer)
        self.secondary.bind(_Onlooker(producer))

    def request(self, record: RequestRecord) -> None:
        self.primary.request(record)
        self.secondary.request(record)

    def would_keep(self, record: RequestRecord) -> bool:
        return self.primary.would_keep(record)

    def flush(self, timeout_millis: int) -> bool:
        ok = self.primary.flush(timeout_millis)
        return self.secondary.flush(timeout_millis) and ok

    def after_fork(self) -> None:
        self.primary.after_fork()
        self.secondary.after_fork()
