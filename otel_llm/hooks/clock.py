"""One tracker's clock: ``time.monotonic()`` seconds and the offset that makes them wall-clock time.

Every hook records monotonic seconds (they never jump); spans, exemplars and the prefill -> decode
carrier need nanoseconds since the epoch. The offset between the two clocks is taken once, when the
tracker starts, and every conversion of that tracker goes through it, so two times of one request can
never disagree by a wall-clock adjustment made in between.
"""

from __future__ import annotations

import time


class Clock:
    """Monotonic seconds <-> wall-clock nanoseconds since the epoch, through one offset.

    ``offset_ns``: wall-clock nanoseconds minus monotonic nanoseconds, taken at construction."""

    __slots__ = ("offset_ns",)

    def __init__(self, offset_ns: int | None = None) -> None:
        self.offset_ns = time.time_ns() - time.monotonic_ns() if offset_ns is None else offset_ns

    def wall_ns(self, mono_s: float) -> int:
        """Monotonic seconds -> wall-clock nanoseconds since the epoch."""
        return self.offset_ns + int(mono_s * 1e9)

    def monotonic_s(self, wall_ns: int) -> float:
        """Wall-clock nanoseconds since the epoch -> monotonic seconds of this clock."""
        return (wall_ns - self.offset_ns) / 1e9
