"""vLLM's engine core: stats logging turned on, and each step's scheduling read for the frontend.

Two wrappers on vLLM's ``Scheduler``, in whichever process runs it (the frontend's, or an engine-core
process of its own, where vLLM loads otel_llm's plugin too):

- ``__init__`` with ``log_stats=True``: only then does vLLM's engine core record each request's QUEUED,
  SCHEDULED and PREEMPTED events and build a ``SchedulerStats`` per step;
- ``schedule`` (read only): what each rescheduling of a preempted request found cached
  (``rescheduling``) and what the step computes per request (``compositions``). With a frontend in
  this process they go to its adapters in memory; in an engine core of its own they are written to the
  frontend's socket (``engine_core_figures``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from otel_llm.integrations.vllm.compositions import recomputing
from otel_llm.integrations.vllm.engine_core_figures import EngineCoreFigures
from otel_llm.integrations.vllm.rescheduling import rescheduled
from otel_llm.integrations.vllm.state import IntegrationState

SITE_SCHEDULE = "Scheduler.schedule"
LOST_STEPS = "what later steps scheduled, re-admitted and found cached (stall and recompute figures)"


def stats_logging_on(state: IntegrationState, original: Callable[..., None]) -> Callable[..., None]:
    """Scheduler.__init__ with ``log_stats=True``: only then does it record request events."""
    import inspect  # here, not at module import: start-up cost under opentelemetry-instrument

    signature = inspect.signature(original)

    def __init__(*args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(*args, **kwargs)
            bound.arguments["log_stats"] = True
            args, kwargs = bound.args, bound.kwargs
        except TypeError:
            pass  # let vLLM report its own argument error
        original(*args, **kwargs)
        if args:
            state.schedulers.add(args[0])  # aborts read its undelivered events

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def read_each_step(state: IntegrationState, original: Callable[..., Any]) -> Callable[..., Any]:
    """Scheduler.schedule, then what its reschedulings found cached and what the step computes per
    request, kept while a frontend in this process is instrumented. With none here (an engine core in
    its own process) both go to the frontend (engine_core_figures): the reschedulings' figures when the
    step re-admits a preempted request, and the step's line every step, one write."""
    sender = state.engine_core_figures
    failed = state.faults.failed

    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not state.adapters:
            ts = time.monotonic()
            output = original(self, *args, **kwargs)
            try:
                # Inline, not a call: this runs on every step, and most steps re-admit nothing.
                cached = output.scheduled_cached_reqs
                if (cached.resumed_req_ids if state.resumed_field else None) or output.scheduled_new_reqs:
                    send_step(sender, self, output, ts, True)
                elif sender.clients:
                    send_step(sender, self, output, ts, False)
            except Exception:
                failed(SITE_SCHEDULE, LOST_STEPS)
            return output
        ts = time.monotonic()  # when the step's scheduling began: the start of its batch()
        output = original(self, *args, **kwargs)
        try:
            hand_over_step(state, self, output, ts)
        except Exception:
            failed(SITE_SCHEDULE, LOST_STEPS)
        return output

    schedule.__wrapped__ = original  # type: ignore[attr-defined]
    return schedule


def send_step(sender: EngineCoreFigures, scheduler: Any, output: Any, ts: float, admits: bool) -> None:
    """One step's reschedulings (``admits``: it schedules new or re-admitted requests) and its line, in
    one write per frontend."""
    found = None
    if admits:
        sender.learn(scheduler, output)
        found = rescheduled(scheduler, output)
    step = None
    scheduled = output.num_scheduled_tokens
    if scheduled and sender.clients:
        total = output.total_num_scheduled_tokens
        step = (ts, scheduled, total, recomputing(scheduler.requests, scheduled, total))
    if found or step:
        sender.send(found or [], step, scheduler.requests)


def hand_over_step(state: IntegrationState, scheduler: Any, output: Any, ts: float) -> None:
    """With a frontend in this process: the step's reschedulings kept for its adapters, and the step
    handed to them (reported when its outputs arrive)."""
    state.reschedulings.record(scheduler, output)
    adapters = list(state.adapters.values())
    for adapter in adapters:
        adapter.pull_steps = None  # the engine core is here: nothing arrives on the socket
    scheduled = output.num_scheduled_tokens
    if scheduled:
        recompute = recomputing(scheduler.requests, scheduled, output.total_num_scheduled_tokens)
        scheduled = dict(scheduled)  # one copy for every adapter: vLLM's object stays vLLM's
        for adapter in adapters:
            adapter.step_scheduled(scheduled, ts, recompute)
