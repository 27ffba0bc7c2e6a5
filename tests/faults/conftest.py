"""Fixtures of the fault tests: a clean, fast-failing OTEL_* environment and things to stop afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from otlp_receivers import clear_otel_env

from otel_llm.export.telemetry import Telemetry

# Short timeouts so an exporter gives up (and its drops are counted) within about a second.
FAST_EXPORT_ENV = {
    "OTEL_EXPORTER_OTLP_TIMEOUT": "1",  # seconds per export, retries included (SDK 1.4x reads seconds)
    "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms between span batches
    "OTEL_METRIC_EXPORT_INTERVAL": "600000",  # metrics leave only on explicit flush: no timing dependence
}


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    clear_otel_env(monkeypatch)
    for name, value in FAST_EXPORT_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # a file fallback, should one happen, stays in the test's directory
    return monkeypatch


@pytest.fixture
def started() -> Iterator[list[Any]]:
    """Receivers and Telemetry handles a test starts; shut down / stopped even when the test fails."""
    things: list[Any] = []
    yield things
    for thing in reversed(things):
        if isinstance(thing, Telemetry):
            thing.shutdown(timeout_s=1)
        else:
            thing.stop()
