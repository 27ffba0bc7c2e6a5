"""A ``RequestTracker``'s constructor arguments, checked once and resolved into ``TrackerOptions``.

Misuse raises ``TypeError`` / ``ValueError`` saying what to pass, before the tracker builds anything.
What is left: the attributes every span and metric point carries, and the tail-sampling and
trace-detail settings, read from the environment where the arguments leave them to it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import Span

from otel_llm import semconv as sc
from otel_llm.sampling import TailSampling
from otel_llm.steps import resolve_detail
from otel_llm.timeline import FinishedRequest

DEFAULT_PROVIDER_NAME = "otel_llm"
DEFAULT_OPERATION_NAME = "text_completion"
DEFAULT_MAX_IN_FLIGHT = 65_536
DEFAULT_MAX_AGE_S = 1800.0  # a request in flight for 30 minutes is leaked, not slow

SpanHook = Callable[[Span, FinishedRequest], None]


@dataclass(frozen=True, slots=True)
class TrackerOptions:
    """A tracker's settings, every one checked (see ``RequestTracker`` for each argument)."""

    role: str
    model: str | None
    max_in_flight: int
    max_age_s: float  # monotonic seconds since queued
    base: dict[str, Any]  # the attributes of every span and metric point
    tail_sampling: TailSampling | None  # None: no tail sampling, every trace kept
    trace_detail: str
    span_hook: SpanHook | None


def resolve_options(
    *,
    model: str | None,
    provider_name: str,
    operation_name: str,
    max_in_flight: int,
    max_age_s: float,
    span_hook: SpanHook | None,
    tail_sampling: TailSampling | bool | None,
    trace_detail: str | None,
    role: str,
    attributes: Mapping[str, str | int | float | bool] | None,
) -> TrackerOptions:
    """The arguments of ``RequestTracker()``, checked; the first bad one raises, saying what to pass."""
    if role not in sc.ROLES:
        raise ValueError(f"role must be one of {', '.join(map(repr, sc.ROLES))}, got {role!r}")
    if tail_sampling is None:
        tail_sampling = TailSampling.from_env()
    elif tail_sampling is True:
        tail_sampling = TailSampling()
    off = tail_sampling is None or tail_sampling is False
    if not off and not isinstance(tail_sampling, TailSampling):
        raise TypeError(
            f"tail_sampling must be a TailSampling, False or None, got {type(tail_sampling).__name__}"
        )
    detail = resolve_detail(trace_detail)
    if not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise ValueError(f"max_in_flight must be a positive int, got {max_in_flight!r}")
    if not isinstance(max_age_s, (int, float)) or not max_age_s > 0:
        raise ValueError(f"max_age_s must be a positive number of seconds, got {max_age_s!r}")
    for name, value in (
        ("model", model),
        ("provider_name", provider_name),
        ("operation_name", operation_name),
    ):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    base: dict[str, Any] = {
        sc.GEN_AI_PROVIDER_NAME: provider_name,
        sc.GEN_AI_OPERATION_NAME: operation_name,
    }
    if model is not None:
        base[sc.GEN_AI_REQUEST_MODEL] = model
    if role != sc.ROLE_BOTH:
        base[sc.LLM_ROLE] = role
    for key, value in (attributes or {}).items():
        if not isinstance(key, str) or not isinstance(value, (str, int, float, bool)):
            raise TypeError(f"attributes must map str to str, int, float or bool, got {key!r}: {value!r}")
        base.setdefault(key, value)  # the tracker's own attributes above keep their values
    if span_hook is not None and not callable(span_hook):
        raise TypeError(f"span_hook must be a callable (span, finished_request) -> None, got {span_hook!r}")
    return TrackerOptions(
        role,
        model,
        max_in_flight,
        float(max_age_s),
        base,
        tail_sampling if isinstance(tail_sampling, TailSampling) else None,
        detail,
        span_hook,
    )
