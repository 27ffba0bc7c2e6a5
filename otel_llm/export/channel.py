"""The engine side of the export process: which trackers feed it (placeholder while it is built)."""

from __future__ import annotations

from typing import Any


def feed_for(tracer_provider: Any, meter_provider: Any, tail: Any) -> Any:
    """The export process's feed for a tracker on these providers, or None (records stay in process)."""
    return None
