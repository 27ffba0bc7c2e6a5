"""The hooks' argument checks: misuse an integration can fix at once raises ``TypeError`` / ``ValueError``
saying what to pass.

Odd data is not misuse: an unknown request, a timestamp out of order, a zero token count are counted as
anomalies by the tracker instead (``otel_llm.hooks.anomalies``), and the engine's call returns as usual.
``check_ids`` runs on every batch hook call, so its common case costs two class identity checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from otel_llm.hooks.batches import check_scheduled
from otel_llm.hooks.engine_state import count


def check_ids(request_ids: Any) -> None:
    if request_ids.__class__ is list or request_ids.__class__ is tuple:
        return  # the common case, without the cost of an ABC isinstance check
    if isinstance(request_ids, (str, bytes)) or not isinstance(request_ids, Iterable):
        raise TypeError(
            f"request_ids must be a sequence of request ids (e.g. [{request_ids!r}]), "
            f"got {type(request_ids).__name__}"
        )


def check_counts(counts: Any, num_ids: int) -> None:
    """``tokens(counts=...)``: one count per request id (the counts themselves are checked per request)."""
    if isinstance(counts, (str, bytes)) or not isinstance(counts, Sequence):
        raise TypeError(f"counts must be a sequence of ints, one per request id, got {type(counts).__name__}")
    if len(counts) != num_ids:
        raise ValueError(f"counts has {len(counts)} entries for {num_ids} request ids")


def check_cached_tokens(request_ids: Iterable[Any], cached: Any) -> tuple[list[Any], list[int]]:
    """``scheduled(cached_tokens=...)``: the request ids as a list, and one prompt-token count each."""
    if isinstance(cached, (str, bytes)) or not isinstance(cached, Sequence):
        raise TypeError(f"cached_tokens must be a sequence of ints, one per request id, got {cached!r}")
    ids = list(request_ids)
    if len(cached) != len(ids):
        raise ValueError(f"cached_tokens has {len(cached)} entries for {len(ids)} request ids")
    return ids, [count("cached_tokens", n) for n in cached]


def check_queued(prompt_tokens: Any, attributes: Any) -> None:
    if prompt_tokens is not None and (not isinstance(prompt_tokens, int) or isinstance(prompt_tokens, bool)):
        raise TypeError(
            f"prompt_tokens must be an int count of prompt tokens, got {type(prompt_tokens).__name__}"
        )
    if attributes is not None and not isinstance(attributes, Mapping):
        raise TypeError(
            f"attributes must be a mapping of attribute name to value, got {type(attributes).__name__}"
        )


def check_reason(reason: Any) -> None:
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a str such as 'stop', 'length', 'abort' or 'error', got {reason!r}")


def check_bytes(num_bytes: Any) -> None:
    if num_bytes is None:
        return
    if not isinstance(num_bytes, int) or isinstance(num_bytes, bool) or num_bytes < 0:
        raise TypeError(f"num_bytes must be a non-negative int count of bytes or None, got {num_bytes!r}")


# The batch hooks of a tracker whose tracer and meter providers are both no-op: no span or metric can
# ever show what they record, so they only check their arguments.


def batch_off(
    request_ids: Sequence[Any], ts: float | None = None, cached_tokens: Sequence[int] | None = None
) -> None:
    """scheduled/preempted of a tracker whose providers are both no-op (``cached_tokens``: scheduled's)."""
    check_ids(request_ids)


def batch_composition_off(scheduled: Any, ts: float | None = None, recompute: Any = None) -> None:
    """batch() (a step's composition) of a tracker whose providers are both no-op: the argument
    checked, nothing kept. Not ``batch_off``, which stands in for the batch hooks scheduled/preempted."""
    check_scheduled(scheduled)


def tokens_off(
    request_ids: Sequence[Any], ts: float | None = None, counts: Sequence[int] | None = None
) -> None:
    """tokens of a tracker whose providers are both no-op."""
    check_ids(request_ids)
