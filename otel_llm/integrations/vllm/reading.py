"""Values the vLLM adapter reads off vLLM's objects, by attribute and member name.

Nothing here imports vLLM, so a vLLM build that renumbers its enums keeps working. Clocks: vLLM stamps
engine-core events and outputs with ``time.monotonic()`` seconds, a request's ``arrival_time`` with
``time.time()`` seconds; the trackers take monotonic seconds.
"""

from __future__ import annotations

import time
from typing import Any

from otel_llm import semconv as sc

# vLLM's FinishReason member names -> our finish reasons; other members are kept, lower-cased
# (vLLM 0.33 also has REPETITION).
_FINISH_REASONS = {
    "STOP": sc.REASON_STOP,
    "LENGTH": sc.REASON_LENGTH,
    "ABORT": sc.REASON_ABORT,
    "ERROR": sc.REASON_ERROR,
}


def finish_reason_name(reason: Any) -> str:
    """Our finish reason for a vLLM ``FinishReason`` (an IntEnum whose STOP is 0, hence falsy)."""
    name = getattr(reason, "name", None)
    if not isinstance(name, str):
        return str(reason).lower()
    return _FINISH_REASONS.get(name, name.lower())


def wall_to_monotonic(wall_ts: float) -> float:
    """Convert a ``time.time()`` value (vLLM's ``arrival_time``) to the ``time.monotonic()`` clock."""
    return wall_ts - (time.time() - time.monotonic())


def prompt_length(request: Any) -> int | None:
    """Number of prompt tokens of an ``EngineCoreRequest`` (token ids or prompt embeddings)."""
    token_ids = getattr(request, "prompt_token_ids", None)
    if token_ids is not None:
        return len(token_ids)
    embeds = getattr(request, "prompt_embeds", None)
    shape = getattr(embeds, "shape", None)
    return int(shape[0]) if shape else None


def choice_count(parent: Any) -> int:
    """``n`` of a vLLM ``ParentRequest`` (1 when there is no parent)."""
    if parent is None:
        return 1
    params = getattr(parent, "sampling_params", None)
    n = getattr(params, "n", 1)
    return n if isinstance(n, int) and n > 1 else 1


def event_time(event: Any) -> float:
    """An engine-core event's timestamp (monotonic seconds): the order its events are replayed in."""
    return event.timestamp
