"""Fixtures of the fault tests: a clean, fast-failing OTEL_* environment and things to stop afterwards."""

from __future__ import annotations

import pytest

# Short timeouts so an exporter gives up (and its drops are counted) within about a second.
FAST_EXPORT_ENV = {
    "OTEL_EXPORTER_OTLP_TIMEOUT": "1",  # seconds per export, retries included (SDK 1.4x reads seconds)
    "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms between span batches
}


@pytest.fixture
def env(env: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The clean environment of tests/conftest.py, plus exporters that give up fast."""
    for name, value in FAST_EXPORT_ENV.items():
        env.setenv(name, value)
    return env
