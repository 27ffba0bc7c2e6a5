"""Timing primitives: warm up, then the median of several rounds, with the garbage collector off.

Every measure is a callable that runs one round and returns (elapsed nanoseconds, units of work);
the result is nanoseconds per unit. Rounds are interleaved across the variants being compared (see
``compare``), so a machine that slows down for a while slows every variant alike and ratios stay fair.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

Round = Callable[[], tuple[int, int]]  # one round -> (elapsed ns, units of work)

perf_ns = time.perf_counter_ns


@dataclass(frozen=True)
class Timing:
    """Nanoseconds per unit of work: the median over rounds, and the spread (min and max)."""

    median_ns: float
    low_ns: float
    high_ns: float
    rounds: int


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect once, then keep every object alive now out of the collector's sight until the end
    (``gc.freeze``): the collection before each round then walks only what the rounds made. In a
    process that already holds a large heap (a pytest worker some hundred tests in, with torch
    imported) each full collection costs a large fraction of a second, and a benchmark's quick mode
    spent ten times its own work in them. Untimed either way: the numbers do not change."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _one(run: Round) -> float:
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()  # a collection landing in one variant's round would be charged to it alone
    try:
        elapsed, units = run()
    finally:
        if enabled:
            gc.enable()
    return elapsed / max(units, 1)


def compare(variants: Mapping[str, Round], rounds: int, warmup: int = 1) -> dict[str, Timing]:
    """Run each variant ``warmup`` times untimed, then ``rounds`` times interleaved; per-unit medians."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    with frozen_heap():
        for run in variants.values():
            for _ in range(warmup):
                _one(run)
        for _ in range(rounds):
            for name, run in variants.items():
                samples[name].append(_one(run))
    return {
        name: Timing(statistics.median(values), min(values), max(values), len(values))
        for name, values in samples.items()
    }
