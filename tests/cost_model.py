"""The engine-time cost model (docs/lifecycle.md, "Engine time") worked out from an engine's own record
of its steps, for the tests that check ``llm.engine.time`` against each engine.

Written here from the documented rule, step by step, independently of ``otel_llm.hooks.engine_time``
(which works from running sums and the tracker's timelines).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

# One step as an engine recorded it: tokens per request, when it began, when it ended (None: it made no
# output, so it ends where the next one begins), and the requests whose tokens were a recompute.
Step = tuple[Mapping[str, int], float, "float | None", Collection[str]]


def shares(steps: Sequence[Step]) -> tuple[dict[str, float], dict[str, float], float]:
    """Per request, its engine seconds and its recompute seconds, and the busy time: each step's time
    (from its start, or the previous step's end if later, to its end) split by tokens."""
    starts = [start for _, start, _, _ in steps]
    last = len(steps) - 1
    ends = [end if end is not None else starts[min(k + 1, last)] for k, (_, _, end, _) in enumerate(steps)]
    total: dict[str, float] = {}
    recompute: dict[str, float] = {}
    busy = 0.0
    for k, (scheduled, _, _, recomputing) in enumerate(steps):
        took = max(0.0, ends[k] - max(starts[k], ends[k - 1] if k else starts[k]))
        busy += took
        tokens = sum(scheduled.values())
        for rid, n in scheduled.items():
            share = took * n / tokens
            total[rid] = total.get(rid, 0.0) + share
            if rid in recomputing:
                recompute[rid] = recompute.get(rid, 0.0) + share
    return total, recompute, busy
