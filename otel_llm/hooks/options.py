"""The hook side's part of a ``RequestTracker``'s constructor arguments, checked once and resolved into
``TrackerOptions``.

Misuse raises ``TypeError`` / ``ValueError`` saying what to pass, before the tracker builds anything.
What is left: the attributes every span and metric point carries and the trace-detail level (read from
the environment where the argument leaves it to it). Tail sampling and the span hook are the emit
side's (``otel_llm.emit.options``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from otel_llm import semconv as sc
from otel_llm.hooks.steps import resolve_detail

DEFAULT_PROVIDER_NAME = "otel_llm"
DEFAULT_OPERATION_NAME = "text_completion"
DEFAULT_MAX_IN_FLIGHT = 65_536
DEFAULT_MAX_AGE_S = 1800.0  # a request in flight for 30 minutes is leaked, not slow


@dataclass(frozen=True, slots=True)
class TrackerOptions:
    """A tracker's settings, every one checked (see ``RequestTracker`` for each argument)."""

    role: str
    model: str | None
    max_in_flight: int
    max_age_s: float  # monotonic seconds since queued
    base: dict[str, Any]  # the attributes of every span and metric point
    trace_detail: str


def resolve_options(
    *,
    model: str | None,
    provider_name: str,
    operation_name: str,
    max_in_flight: int,
    max_age_s: float,
    trace_detail: str | None,
    role: str,
    attributes: Mapping[str, str | int | float | bool] | None,
) -> TrackerOptions:
    """The arguments of ``RequestTracker()``, checked; the first bad one raises, saying what to pass."""
    if role not in sc.ROLES:
        raise ValueError(f"role must be one of {', '.join(map(repr, sc.ROLES))}, got {role!r}")
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
    for key, attribute in (attributes or {}).items():
        if not isinstance(key, str) or not isinstance(attribute, (str, int, float, bool)):
            raise TypeError(f"attributes must map str to str, int, float or bool, got {key!r}: {attribute!r}")
        base.setdefault(key, attribute)  # the tracker's own attributes above keep their values
    return TrackerOptions(
        role,
        model,
        max_in_flight,
        float(max_age_s),
        base,
        detail,
    )
