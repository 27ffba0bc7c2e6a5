"""The engine's own state, reported through ``RequestTracker.engine_state()`` and exported as metrics.

An engine calls ``engine_state()`` once per step or once per stats interval (vLLM's ``SchedulerStats``
cadence). The call only stores numbers and adds to plain ints; the OpenTelemetry instruments read them
at collection time:

| metric | instrument | unit | from |
|---|---|---|---|
| ``llm.server.kv_cache.usage`` | gauge | 1 | ``kv_cache_usage``: fraction of KV-cache blocks in use, 0..1 |
| ``llm.server.scheduler.requests`` | gauge | {request} | ``running`` / ``waiting`` (``llm.request.state``) |
| ``llm.server.prefix_cache.queries`` | counter | {token} | ``prefix_cache_queries``: tokens looked up |
| ``llm.server.prefix_cache.hits`` | counter | {token} | ``prefix_cache_hits``: of those, found in the cache |
| ``llm.server.spec_decode.draft_tokens`` | counter | {token} | ``spec_drafted_tokens`` |
| ``llm.server.spec_decode.accepted_tokens`` | counter | {token} | ``spec_accepted_tokens`` |
| ``llm.server.step.tokens`` | histogram | {token} | ``step_tokens``: tokens fed to the model in one step |
| ``llm.server.prompt_tokens`` | counter | {token} | ``prompt_tokens_{computed,cached,transferred}`` |

Counter arguments are increments since the previous call; gauges are the latest values. A metric is
exported from the first call that reports it on. The prompt tokens go by ``llm.prompt_tokens.source``
(computed, prefix_cache, kv_transfer), each request counted once, at its first scheduling, as vLLM's
``vllm:prompt_tokens_by_source``: a recompute after a preemption is not prompt work
(``llm.server.recompute.tokens`` counts it). The histogram is a ``BucketHistogram`` of the tracker's
``RequestMetrics``, so it reaches every reader through the SDK bridge like the latency histograms.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any

from otel_llm import semconv as sc
from otel_llm.metrics import RequestMetrics

if TYPE_CHECKING:  # annotations only
    from otel_llm.steps import StepLog

# (argument / attribute, metric name, description) of each counter.
_COUNTERS = (
    ("prefix_cache_queries", sc.METRIC_PREFIX_CACHE_QUERIES, "Prompt tokens looked up in the prefix cache"),
    ("prefix_cache_hits", sc.METRIC_PREFIX_CACHE_HITS, "Prompt tokens found in the prefix cache"),
    ("spec_drafted_tokens", sc.METRIC_SPEC_DRAFT_TOKENS, "Speculative tokens proposed by the drafter"),
    ("spec_accepted_tokens", sc.METRIC_SPEC_ACCEPTED_TOKENS, "Speculative tokens accepted by the target"),
)
# (argument, llm.prompt_tokens.source) of the prompt-token counter's three sources.
_PROMPT_SOURCES = (
    ("prompt_tokens_computed", sc.PROMPT_SOURCE_COMPUTED),
    ("prompt_tokens_cached", sc.PROMPT_SOURCE_PREFIX_CACHE),
    ("prompt_tokens_transferred", sc.PROMPT_SOURCE_KV_TRANSFER),
)


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
    """The latest gauges and the counter totals of one tracker's engine, under its metrics' lock."""

    def __init__(self, metrics: RequestMetrics) -> None:
        self._metrics = metrics
        self.kv_cache_usage: float | None = None
        self.running: int | None = None
        self.waiting: int | None = None
        self.totals: dict[str, int | None] = {arg: None for arg, _, _ in _COUNTERS}
        # Prompt tokens by source; all three are exported from the first report on (as vLLM does), so a
        # share of them never lacks a series.
        self.prompt_tokens: dict[str, int] | None = None
        metrics.observe(
            sc.METRIC_KV_CACHE_USAGE,
            sc.UNIT_RATIO,
            "Fraction of KV-cache blocks in use (0..1)",
            self._observe_usage,
            counter=False,
            gauge=True,
        )
        metrics.observe(
            sc.METRIC_SCHEDULER_REQUESTS,
            sc.UNIT_REQUEST,
            "Requests in the engine's running batch and waiting queue, as the engine counts them",
            self._observe_requests,
            counter=False,
            gauge=True,
        )
        for arg, name, description in _COUNTERS:
            metrics.observe(name, sc.UNIT_TOKEN, description, self._counter_callback(arg), counter=True)
        metrics.observe(
            sc.METRIC_PROMPT_TOKENS,
            sc.UNIT_TOKEN,
            "Prompt tokens of requests scheduled for the first time, by source: computed, prefix cache, "
            "KV transfer",
            self._observe_prompt_tokens,
            counter=True,
        )

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
    ) -> tuple[float | None, int | None]:
        """Check and store one ``engine_state()`` report; returns the checked (usage, step tokens).

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
        metrics = self._metrics
        # One lock for the numbers and the step histogram: the metrics' own, which a forked child renews.
        with metrics.lock:
            if step_tokens is not None:
                metrics.step_tokens.add(step_tokens, None)
            if kv is not None:
                self.kv_cache_usage = kv
            if running is not None:
                self.running = running
            if waiting is not None:
                self.waiting = waiting
            if counted:
                totals = self.totals
                for (arg, _, _), n in zip(_COUNTERS, (queries, hits, drafted, accepted), strict=True):
                    if n:
                        totals[arg] = (totals[arg] or 0) + n
            if sourced:
                by_source = self.prompt_tokens
                if by_source is None:
                    by_source = self.prompt_tokens = {source: 0 for _, source in _PROMPT_SOURCES}
                for (_, source), n in zip(_PROMPT_SOURCES, (computed, cached, transferred), strict=True):
                    by_source[source] += n
        return kv, step_tokens

    def _observe_usage(self) -> list[tuple[float, dict[str, Any]]]:
        usage = self.kv_cache_usage
        return [] if usage is None else [(usage, {})]

    def _observe_requests(self) -> list[tuple[float, dict[str, Any]]]:
        out: list[tuple[float, dict[str, Any]]] = []
        if self.running is not None:
            out.append((self.running, {sc.LLM_REQUEST_STATE: sc.STATE_RUNNING}))
        if self.waiting is not None:
            out.append((self.waiting, {sc.LLM_REQUEST_STATE: sc.STATE_WAITING}))
        return out

    def _observe_prompt_tokens(self) -> list[tuple[float, dict[str, Any]]]:
        by_source = self.prompt_tokens
        if by_source is None:
            return []
        return [(n, {sc.LLM_PROMPT_TOKENS_SOURCE: source}) for source, n in list(by_source.items())]

    def _counter_callback(self, arg: str) -> Any:
        def observe() -> list[tuple[float, dict[str, Any]]]:
            total = self.totals[arg]
            return [] if total is None else [(total, {})]

        return observe


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
    kept for ``llm.engine.step`` spans, or None) and ``_lock`` (its registry's lock).
    """

    _engine_state: EngineState
    _step_log: StepLog | None
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
        numbers; the metrics are read at collection time (``otel_llm.engine_state``)."""
        kv, step = self._engine_state.report(
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
        if log is not None and (step is not None or kv is not None):
            with self._lock:
                log.note_state(step, kv)
