"""Fixtures of the fault tests: a clean, fast-failing OTEL_* environment and things to stop afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest
from otlp_receivers import clear_otel_env

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
