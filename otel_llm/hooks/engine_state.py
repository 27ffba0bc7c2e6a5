"""The engine's own state, reported through ``RequestTracker.engine_state()``: plain numbers.

An engine calls ``engine_state()`` once per step or once per stats interval (vLLM's ``SchedulerStats``
cadence). The call checks its arguments and stores numbers under the tracker's lock: gauges are the
latest values, counters are totals of the increments given, tokens per step go to the tracker's step
recorder. The tracker's ``figures()`` hands them to the emit side, which exports them as metrics
(``otel_llm.emit.engine_metrics`` lists them).
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any

from otel_llm import semconv as sc

if TYPE_CHECKING:  # annotations only
    from otel_llm.hooks.steps import StepLog
    from otel_llm.record import StepRecorder

# The counter arguments of engine_state(), as Figures.counters keys them.
COUNTERS = ("prefix_cache_queries", "prefix_cache_hits", "spec_drafted_tokens", "spec_accepted_tokens")
# The llm.prompt_tokens.source of each prompt-token argument (computed, cached, transferred).
PROMPT_SOURCES = (sc.PROMPT_SOURCE_COMPUTED, sc.PROMPT_SOURCE_PREFIX_CACHE, sc.PROMPT_SOURCE_KV_TRANSFER)


def count(name: str, value: Any) -> int:
    """A non-negative int count, or TypeError / ValueError saying what to pass."""
    if value.__class__ is not int:
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError(f"{name} must be an int count, got {value!r}")
        value = int(value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


class EngineState:
    """The latest gauges and the counter totals of one tracker's engine, plain numbers under the
    tracker's lock (read by ``figures()``)."""

    def __init__(self) -> None:
        self.kv_cache_usage: float | None = None
        self.running: int | None = None
        self.waiting: int | None = None
        self.totals: dict[str, int | None] = {arg: None for arg in COUNTERS}
        # Prompt tokens by source; all three are exported from the first report on (as vLLM does), so a
        # share of them never lacks a series.
        self.prompt_tokens: dict[str, int] | None = None

    def report(
        self,
        kv_cache_usage: Any,
        running: Any,
        waiting: Any,
        queries: Any,
        hits: Any,
        drafted: Any,
        accepted: Any,
        step_tokens: Any,
        computed: Any = 0,
        cached: Any = 0,
        transferred: Any = 0,
    ) -> tuple[float | None, int | None, Any]:
        """Check one ``engine_state()`` report; returns (usage, step tokens, what ``store`` takes).

        Called once per engine step, so plain ints and floats in range take a path of identity and range
        checks only (about a tenth of the general checks); anything else goes through ``count`` /
        ``usage``, which convert or raise. Nothing is stored when any argument is bad."""
        kv = kv_cache_usage
        if kv is not None and (kv.__class__ is not float or not 0.0 <= kv <= 1.0):
            kv = usage(kv)
        if running is not None and (running.__class__ is not int or running < 0):
            running = count("running", running)
        if waiting is not None and (waiting.__class__ is not int or waiting < 0):
            waiting = count("waiting", waiting)
        if step_tokens is not None and (step_tokens.__class__ is not int or step_tokens < 0):
            step_tokens = count("step_tokens", step_tokens)
        counted = bool(queries or hits or drafted or accepted)
        sourced = bool(computed or cached or transferred)
        if sourced:
            if computed.__class__ is not int or computed < 0:
                computed = count("prompt_tokens_computed", computed)
            if cached.__class__ is not int or cached < 0:
                cached = count("prompt_tokens_cached", cached)
            if transferred.__class__ is not int or transferred < 0:
                transferred = count("prompt_tokens_transferred", transferred)
        if counted:
            if queries.__class__ is not int or queries < 0:
                queries = count("prefix_cache_queries", queries)
            if hits.__class__ is not int or hits < 0:
                hits = count("prefix_cache_hits", hits)
            if drafted.__class__ is not int or drafted < 0:
                drafted = count("spec_drafted_tokens", drafted)
            if accepted.__class__ is not int or accepted < 0:
                accepted = count("spec_accepted_tokens", accepted)
        counters = (queries, hits, drafted, accepted) if counted else None
        sources = (computed, cached, transferred) if sourced else None
        return kv, step_tokens, (kv, running, waiting, counters, sources)

    def store(self, checked: Any) -> None:
        """Store what ``report`` checked. Caller holds the tracker's lock."""
        kv, running, waiting, counters, sources = checked
        if kv is not None:
            self.kv_cache_usage = kv
        if running is not None:
            self.running = running
        if waiting is not None:
            self.waiting = waiting
        if counters is not None:
            totals = self.totals
            for arg, n in zip(COUNTERS, counters, strict=True):
                if n:
                    totals[arg] = (totals[arg] or 0) + n
        if sources is not None:
            by_source = self.prompt_tokens
            if by_source is None:
                by_source = self.prompt_tokens = {source: 0 for source in PROMPT_SOURCES}
            for source, n in zip(PROMPT_SOURCES, sources, strict=True):
                by_source[source] += n


def usage(value: Any) -> float:
    """A KV-cache usage fraction in [0, 1], or TypeError / ValueError saying what to pass."""
    if value.__class__ is not float:
        # Numbers of other types (numpy scalars, Fraction) convert; bools and strings are mistakes.
        if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
            raise TypeError(f"kv_cache_usage must be a fraction between 0 and 1, got {value!r}")
        value = float(value)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"kv_cache_usage must be a fraction between 0 and 1 (used / all blocks): {value!r}")
    return value


class EngineStateHook:
    """``RequestTracker.engine_state()``: the engine's own state, beside the five lifecycle hooks.

    The tracker sets ``_engine_state`` (this module's ``EngineState``), ``_step_log`` (the engine steps
    kept for ``llm.engine.step`` spans, or None), ``_step_tokens`` (where tokens per step go) and
    ``_lock`` (its registry's lock).
    """

    _engine_state: EngineState
    _step_log: StepLog | None
    _step_tokens: StepRecorder
    _lock: threading.Lock

    def engine_state(
        self,
        *,
        kv_cache_usage: float | None = None,
        running: int | None = None,
        waiting: int | None = None,
        prefix_cache_queries: int = 0,
        prefix_cache_hits: int = 0,
        spec_drafted_tokens: int = 0,
        spec_accepted_tokens: int = 0,
        step_tokens: int | None = None,
        prompt_tokens_computed: int = 0,
        prompt_tokens_cached: int = 0,
        prompt_tokens_transferred: int = 0,
    ) -> None:
        """What the engine knows of itself, once per step (after its ``tokens()``) or per stats interval.

        Gauges (latest value wins): ``kv_cache_usage`` (fraction of KV blocks in use, 0..1), ``running``
        and ``waiting`` (requests, as the engine's scheduler counts them). Increments since the previous
        call: ``prefix_cache_queries`` / ``prefix_cache_hits`` (prompt tokens looked up / found cached),
        ``spec_drafted_tokens`` / ``spec_accepted_tokens`` (speculative decoding). ``step_tokens``: tokens
        fed to the model in this step, one histogram sample. ``prompt_tokens_computed`` / ``_cached`` /
        ``_transferred``: the prompt tokens of requests scheduled for the first time since the previous
        call, by where they came from (computed, local prefix cache, a KV transfer), as vLLM's
        ``vllm:prompt_tokens_by_source`` counts them. None / 0 means "not reported". Only stores
        numbers; the metrics are read at collection time (``otel_llm.emit.engine_metrics``)."""
        state = self._engine_state
        kv, step, checked = state.report(
            kv_cache_usage,
            running,
            waiting,
            prefix_cache_queries,
            prefix_cache_hits,
            spec_drafted_tokens,
            spec_accepted_tokens,
            step_tokens,
            prompt_tokens_computed,
            prompt_tokens_cached,
            prompt_tokens_transferred,
        )
        log = self._step_log
        # One lock for the numbers and the step histogram: the tracker's own, which a forked child renews.
        with self._lock:
            state.store(checked)
            if step is not None:
                self._step_tokens.add(step, 1)
            if log is not None and (step is not None or kv is not None):
                log.note_state(step, kv)
