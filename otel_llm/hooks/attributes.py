"""Limits on the user attributes given to ``queued(attributes=...)``, which go on the request span only.

Attribute values an OpenTelemetry span accepts are str, bool, int, float, or a homogeneous sequence of
them. Anything else is dropped; strings are cut; past a count the rest is dropped. Every drop or cut
is counted (the ``otel_llm.anomalies`` self-metric, kinds below) so a caller sending oversized data
notices. None of these attributes reaches a metric: metric attributes are a fixed allow-list, so
cardinality stays bounded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from otel_llm.hooks.anomalies import ATTRIBUTE_DROPPED, ATTRIBUTE_TRUNCATED

MAX_ATTRIBUTES = 32  # user attributes kept per request
MAX_VALUE_LENGTH = 1024  # characters kept of a string value (and of each string in a sequence)

_SCALARS = (str, bool, int, float)


def _clean_value(value: Any) -> tuple[Any, bool]:
    """(value to keep or None to drop, whether a string was cut)."""
    if isinstance(value, str):
        return (value[:MAX_VALUE_LENGTH], True) if len(value) > MAX_VALUE_LENGTH else (value, False)
    if isinstance(value, _SCALARS):
        return value, False
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        items = list(value)
        kinds = {type(v) for v in items}
        if len(kinds) > 1 or not kinds <= set(_SCALARS):
            return None, False
        if kinds == {str}:
            cut = [v[:MAX_VALUE_LENGTH] for v in items]
            return tuple(cut), any(len(v) > MAX_VALUE_LENGTH for v in items)
        return tuple(items), False
    return None, False


def clean(attributes: Mapping[Any, Any]) -> tuple[dict[str, Any], list[str]]:
    """The attributes to keep, and the anomaly kinds to count (one entry per dropped or cut value)."""
    kept: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in attributes.items():
        if not isinstance(key, str) or len(kept) >= MAX_ATTRIBUTES:
            problems.append(ATTRIBUTE_DROPPED)
            continue
        cleaned, cut = _clean_value(value)
        if cleaned is None:
            problems.append(ATTRIBUTE_DROPPED)
            continue
        if cut:
            problems.append(ATTRIBUTE_TRUNCATED)
        kept[key] = cleaned
    return kept, problems
