"""The OTLP exporters' own log lines, counted instead of written (``configure(exporter_logs="count")``).

With no collector listening, the SDK's exporters write a retry line for every export they retry and a
failure line for every batch they give up on, hundreds of characters each, in the middle of a command's
own output. A command that reports what was delivered and lost itself (``otel-llm demo``, ``serve``)
counts those lines instead and says how many there were. Only records of WARNING and above are counted;
lower ones are left to the logging configuration. The loggers are the exporters' module loggers, so
``install`` runs once the exporters of a pipeline are imported (``configure()`` builds them first).
"""

from __future__ import annotations

import logging
import threading

# The loggers of the SDK's OTLP exporters and of the processors that report their failures.
_LOGGERS = ("opentelemetry.exporter", "opentelemetry.sdk.trace.export", "opentelemetry.sdk.metrics")
SHOW = "show"
COUNT = "count"
MODES = (SHOW, COUNT)
ENV_EXPORTER_LOGS = "OTEL_LLM_EXPORTER_LOGS"


class ExporterLines(logging.Filter):
    """Counts the exporters' WARNING-and-above records and keeps them from every handler."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        with self._lock:
            self.count += 1
        return False


def install(lines: ExporterLines) -> None:
    """Put ``lines`` on every logger of the exporters and processors there is now (filters act on the
    logger a record is made on, not on its parents)."""
    names = [n for n in list(logging.root.manager.loggerDict) if n.startswith(_LOGGERS)]
    for name in (*_LOGGERS, *names):
        logger = logging.getLogger(name)
        if lines not in logger.filters:
            logger.addFilter(lines)


def exporter_logs(value: str | None) -> str:
    """``value``, else ``OTEL_LLM_EXPORTER_LOGS``, else ``show``; ValueError naming the bad one."""
    import os

    source = "exporter_logs"
    if value is None:
        value = os.environ.get(ENV_EXPORTER_LOGS, "").strip().lower() or SHOW
        source = ENV_EXPORTER_LOGS
    if value not in MODES:
        raise ValueError(f"{source}={value!r}: pass {SHOW!r} (the exporters' lines as they are) or {COUNT!r}")
    return value
