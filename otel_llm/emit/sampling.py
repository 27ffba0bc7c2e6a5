"""Tail sampling at the source: whether a finished request's trace is kept, decided at ``finished()``.

otel_llm builds a request's spans only when it finishes, so it can decide then, with everything a
collector's tail sampler would need, and a trace it does not keep costs nothing: its spans are never
built. The rules, in the order they are asked (the first that keeps a trace names the reason):

- ``error``: the request failed (finish reason ``error`` or ``abandoned``);
- ``preempted``: it was preempted at least once;
- ``slow_ttft``: its time to first token (first token - arrival, seconds) exceeded ``ttft_s``;
- ``slow_e2e``: its duration (finished - arrival, seconds) exceeded ``e2e_s``;
- ``parent_sampled``: the caller's parent span (W3C ``traceparent`` or a local span) was sampled, so the
  caller's trace would otherwise miss a subtree;
- ``prefill_kept``: on a decode instance, the prefill instance kept the request's spans (its decision
  travels in the hand-off carrier, ``otel_llm.hooks.handoff``), so the trace keeps both halves;
- ``ratio``: a share ``ratio`` of the rest, chosen by trace id (the low 64 bits below ``ratio * 2**64``,
  as the SDK's ``TraceIdRatioBased``), so every process of a trace agrees.

What is not kept is dropped with reason ``ratio``. Metrics count every request either way; only the
exemplars of dropped requests are left out (they would point at traces that do not exist). The head
sampler (``OTEL_TRACES_SAMPLER``) still applies to the traces kept here.

Configuration: ``RequestTracker(tail_sampling=TailSampling(...))``, or from the environment:

| variable | meaning | default |
|---|---|---|
| ``OTEL_LLM_TAIL_SAMPLING`` | ``on`` or ``off`` | ``off`` (keep every trace) |
| ``OTEL_LLM_TAIL_SAMPLING_RATIO`` | share of the other requests kept, 0..1 | ``0.05`` |
| ``OTEL_LLM_TAIL_SAMPLING_TTFT_S`` | keep when TTFT is above this many seconds | unset (rule off) |
| ``OTEL_LLM_TAIL_SAMPLING_E2E_S`` | keep when the request took longer (seconds) | unset (rule off) |
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from typing import Any

from otel_llm import semconv as sc
from otel_llm.emit.intervals import Intervals
from otel_llm.record import RequestRecord

__all__ = ["DEFAULT_RATIO", "ENV_E2E_S", "ENV_RATIO", "ENV_TAIL_SAMPLING", "ENV_TTFT_S", "TailSampling"]

ENV_TAIL_SAMPLING = "OTEL_LLM_TAIL_SAMPLING"
ENV_RATIO = "OTEL_LLM_TAIL_SAMPLING_RATIO"
ENV_TTFT_S = "OTEL_LLM_TAIL_SAMPLING_TTFT_S"
ENV_E2E_S = "OTEL_LLM_TAIL_SAMPLING_E2E_S"
DEFAULT_RATIO = 0.05

KEEP = "keep"
DROP = "drop"
REASON_ERROR = "error"
REASON_PREEMPTED = "preempted"
REASON_SLOW_TTFT = "slow_ttft"
REASON_SLOW_E2E = "slow_e2e"
REASON_PARENT_SAMPLED = "parent_sampled"
REASON_PREFILL_KEPT = "prefill_kept"
REASON_RATIO = "ratio"

_LOW_64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class TailSampling:
    """Which finished requests keep their trace. Thresholds are seconds; None turns that rule off."""

    ratio: float = DEFAULT_RATIO
    ttft_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float)):
            raise TypeError(f"ratio must be a number between 0 and 1, got {self.ratio!r}")
        if not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"ratio must be between 0 and 1 (the share of traces kept), got {self.ratio!r}")
        for name in ("ttft_s", "e2e_s"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number of seconds or None, got {value!r}")
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")

    @classmethod
    def from_env(cls, environ: Any = None) -> TailSampling | None:
        """The settings in ``OTEL_LLM_TAIL_SAMPLING*``; None when tail sampling is off (the default).

        Raises ValueError naming the variable when a value cannot be used."""
        env = os.environ if environ is None else environ
        switch = env.get(ENV_TAIL_SAMPLING, "").strip().lower()
        if switch in ("", "off", "false", "0"):
            return None
        if switch not in ("on", "true", "1"):
            raise ValueError(f"{ENV_TAIL_SAMPLING} must be 'on' or 'off', got {env.get(ENV_TAIL_SAMPLING)!r}")
        values: dict[str, float] = {}
        for field, name in (("ratio", ENV_RATIO), ("ttft_s", ENV_TTFT_S), ("e2e_s", ENV_E2E_S)):
            value = _env_number(env, name)
            if value is None:
                continue
            try:  # each value checked on its own, so the message names its variable
                cls(**{field: value})
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{name}: {exc}") from None
            values[field] = value
        return cls(**values)


def resolve_tail(value: TailSampling | bool | None) -> TailSampling | None:
    """``RequestTracker(tail_sampling=...)``: a ``TailSampling``, True (the defaults), False (off), or None
    (``OTEL_LLM_TAIL_SAMPLING*``); None when every trace is kept. TypeError for anything else."""
    if value is None:
        return TailSampling.from_env()
    if value is True:
        return TailSampling()
    if value is False:
        return None
    if not isinstance(value, TailSampling):
        raise TypeError(f"tail_sampling must be a TailSampling, False or None, got {type(value).__name__}")
    return value


def _env_number(env: Any, name: str) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


class TailSampler:
    """Applies a ``TailSampling`` to finished requests and counts its decisions by (decision, reason)."""

    def __init__(self, settings: TailSampling) -> None:
        self.settings = settings
        self._bound = int(settings.ratio * (1 << 64))  # keep when the trace id's low 64 bits are below
        self._lock = threading.Lock()
        self.decisions: dict[tuple[str, str], int] = {}

    def keep(self, rec: RequestRecord, iv: Intervals) -> bool:
        """Whether the request's spans are built; the decision is counted."""
        reason = self._reason(rec, iv)
        decision = DROP if reason is None else KEEP
        key = (decision, reason or REASON_RATIO)
        with self._lock:
            self.decisions[key] = self.decisions.get(key, 0) + 1
        return reason is not None

    def would_keep(self, rec: RequestRecord, iv: Intervals) -> bool:
        """What ``keep()`` would decide, without counting a decision."""
        return self._reason(rec, iv) is not None

    def _reason(self, rec: RequestRecord, iv: Intervals) -> str | None:
        s = self.settings
        if rec.reason in sc.FAILED_REASONS:
            return REASON_ERROR
        if rec.preemptions:
            return REASON_PREEMPTED
        if s.ttft_s is not None and iv.ttft is not None and iv.ttft > s.ttft_s:
            return REASON_SLOW_TTFT
        if s.e2e_s is not None and iv.e2e is not None and iv.e2e > s.e2e_s:
            return REASON_SLOW_E2E
        parent = rec.parent
        if parent is not None and parent[2] & 0x01:  # the parent's trace flags: sampled
            return REASON_PARENT_SAMPLED
        if rec.prefill_kept:
            return REASON_PREFILL_KEPT
        if (rec.trace_id & _LOW_64) < self._bound:
            return REASON_RATIO
        return None

    def observe(self) -> list[tuple[float, dict[str, Any]]]:
        """``otel_llm.emit.sampling.decisions`` points (run in the metric reader's thread)."""
        with self._lock:
            items = list(self.decisions.items())
        return [
            (n, {sc.LLM_SAMPLING_DECISION: decision, sc.LLM_SAMPLING_REASON: reason})
            for (decision, reason), n in items
        ]
