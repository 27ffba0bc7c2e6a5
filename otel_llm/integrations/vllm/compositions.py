"""What each step of an in-process vLLM scheduler computed per request, for the tracker's ``batch()``.

``Scheduler.schedule()`` returns a ``SchedulerOutput`` whose ``num_scheduled_tokens`` maps each request
id to the tokens the step computes for it (a prefill chunk, a recompute, one decode token, or several
with speculative decoding): the tracker's ``batch()`` argument as it is. The instrumentor's wrapper of
``schedule()`` hands it, with the monotonic time the step's scheduling began, to the adapters of this
process; the adapter whose requests the step holds keeps it here until the step's outputs reach the
frontend, and reports it there, after replaying the outputs' events and before their tokens, which is
the tracker's call order (its SCHEDULED and PREEMPTED events ride on those outputs, so only then does the
tracker know which requests are new).

A preempted request's PREEMPTED and SCHEDULED events reach the frontend only with its next token, after
its recompute, so the tracker cannot tell a recompute chunk from a prompt chunk or speculative tokens;
the scheduler can: ``recomputing`` names them, from vLLM's ``Request`` at the step (preempted before,
and fewer tokens computed than it holds), and they go to ``batch()`` as its ``recompute``.

Where the engine core runs in the frontend's process (``LLM`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
or a driver running the scheduler itself) the wrapper hands the step to the adapters directly. In vLLM's
own engine-core process there is no adapter: the wrapper writes the step, with the same ``recomputing``,
to the frontend's socket (``engine_core_figures``), and the frontend reads it in as the step's outputs
arrive, into the same ``Compositions``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

# Steps scheduled but not yet delivered, at most. vLLM keeps at most two in flight, but under `vllm serve`
# a frontend whose output loop is held up (a burst of new requests, a pause) reads the engine core's
# lines that many steps behind, and the oldest would go first: its next outputs would find no step. The
# bound is for the odd path where outputs never come, such as an engine stopped mid-step; a decode batch
# that did not change is one shared mapping, so even a full deque is small.
MAX_PENDING_STEPS = 1024


Step = tuple[float, dict[Any, int], "list[Any] | None"]
"""(monotonic seconds the scheduling began, request id -> tokens, the requests it recomputes or None)."""


def recomputing(requests: Mapping[Any, Any], scheduled: Mapping[Any, int], total: Any) -> list[Any] | None:
    """The requests of one step whose scheduled tokens are a recompute, or None when there are none.

    ``requests``: the scheduler's (id -> vLLM ``Request``; schedule() has added the step's tokens to
    ``num_computed_tokens``); ``total``: the output's ``total_num_scheduled_tokens``. A step where every
    request computes one token (a decode step, the common case) is told by that total alone. A request
    recomputes when it was preempted before and, before the step, had computed fewer tokens than all but
    its last one (a decoding request has computed exactly those; speculative tokens come after them)."""
    if total == len(scheduled):
        return None
    found = []
    for rid, n in [(rid, n) for rid, n in scheduled.items() if n != 1]:
        req = requests.get(rid)
        if req is None or not getattr(req, "num_preemptions", 0):
            continue
        if req.num_computed_tokens - n < req.num_tokens - 1:
            found.append(rid)
    return found or None


class Compositions:
    """Scheduled steps not yet delivered (``Step``), oldest first.

    Written by the scheduler's thread, read by the frontend's (the same thread for ``LLM``); ``deque``'s
    append and popleft are atomic, so no lock."""

    def __init__(self) -> None:
        self._steps: deque[Step] = deque(maxlen=MAX_PENDING_STEPS)

    def add(self, ts: float, scheduled: dict[Any, int], recompute: list[Any] | None) -> None:
        """One ``schedule()`` result's ``num_scheduled_tokens`` and the requests it recomputes
        (``recomputing``). ``scheduled`` is kept as given, not copied: it is otel_llm's own (a copy of
        vLLM's, or decoded from the engine core's line), and nothing changes it. A decode batch that
        did not change comes as the same mapping, step after step."""
        self._steps.append((ts, scheduled, recompute))

    def due(self, by: float) -> list[Step]:
        """The steps scheduled at or before ``by`` (the delivered outputs' timestamp), oldest first."""
        steps = self._steps
        out = []
        while steps and steps[0][0] <= by:
            out.append(steps.popleft())
        return out

    def __bool__(self) -> bool:
        return bool(self._steps)

    def __len__(self) -> int:
        return len(self._steps)
