"""What otel_llm adds to each step of vLLM's engine core when that core runs in its own process.

``python -m benchmarks.engine_core_figures`` prints a Markdown section. In an engine-core process the
instrumentor's ``Scheduler.schedule`` wrapper checks each ``SchedulerOutput`` for re-admitted
(preempted) requests and, when there are some, writes their cached-token figures to the frontend's
Unix socket, one write per step; and every step it writes the step's line (what it computes per
request, for the frontend's stall figures) there too (``otel_llm.integrations.vllm.engine_core_figures``).
This times that wrapper around a ``schedule`` that returns a ready output, against the bare
``schedule``, interleaved: a plain decode step (nothing re-admitted), and steps re-admitting 1 and 4
preempted requests (each recomputing 32 tokens), sent to a real receiving socket in this process (read
every 20 steps, untimed, as the frontend reads as outputs arrive); the wrapper with the reschedulings'
figures alone (no frontend known to send steps to) and with the step line too (a frontend known, as
always once a request came). Then the frontend's read of the socket as each batch of outputs arrives:
with nothing written, and with one decode step's line written before it (the write untimed).

vLLM itself is not needed: the output and requests are plain objects with the attributes the wrapper
reads from vLLM 0.32/0.33 (``scheduled_cached_reqs.resumed_req_ids`` / ``req_ids`` /
``num_computed_tokens``, ``scheduled_new_reqs``, and per request ``events`` and ``client_index``), so
the figure is the wrapper's own cost, not the scheduler's. CPU nanoseconds per step (process time),
median of rounds.
"""

from __future__ import annotations

import itertools
import os
import time
from types import SimpleNamespace
from typing import Any

from benchmarks.timing import compare
from otel_llm.integrations.faults import Faults
from otel_llm.integrations.vllm.engine_core import read_each_step
from otel_llm.integrations.vllm.engine_core_figures import EngineCoreFigures
from otel_llm.integrations.vllm.frontend_figures import FrontendFigures
from otel_llm.integrations.vllm.state import IntegrationState, log

STEPS = 2000  # schedule() calls per round
QUICK_STEPS = 200  # with --quick: the numbers mean little, the paths all run
ROUNDS = 15
BATCH = 64  # requests running in every step
# Steps between two reads of the receiving socket: well within what its buffer holds, as a frontend
# reads each one when it replays the rescheduling (one step later).
DRAIN_EVERY = 20


def scheduler_and_outputs(resumed: int) -> tuple[Any, Any]:
    """A scheduler holding ``BATCH`` requests and one step's output re-admitting ``resumed`` of them."""
    scheduled = SimpleNamespace(name="SCHEDULED")
    requests = {
        f"cmpl-{k:016x}-0-{k:08x}": SimpleNamespace(
            events=[SimpleNamespace(type=scheduled, timestamp=1000.0 + k)], client_index=0, num_preemptions=1
        )
        for k in range(BATCH)
    }
    ids = list(requests)
    cached_reqs = SimpleNamespace(
        req_ids=ids, num_computed_tokens=[32 * k for k in range(BATCH)], resumed_req_ids=set(ids[:resumed])
    )
    scheduled = {rid: 32 if k < resumed else 1 for k, rid in enumerate(ids)}
    output = SimpleNamespace(
        scheduled_cached_reqs=cached_reqs,
        scheduled_new_reqs=[],
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
    )
    for k, rid in enumerate(ids):  # after schedule(): the step's tokens counted as computed
        requests[rid].num_computed_tokens = 32 * k + scheduled[rid]
        requests[rid].num_tokens = 32 * k + (64 if k < resumed else 1)
    return SimpleNamespace(requests=requests), output


def changed_every_step(output: Any) -> list[Any]:
    """``output`` and the same step with its first two requests swapped: returned in turn, every step's
    ids differ from the step before (a batch that changed; an unchanged one is written as ``=``)."""
    scheduled = dict(output.num_scheduled_tokens)
    first, second, *_ = scheduled
    swapped = {second: scheduled[second], first: scheduled[first], **scheduled}  # the rest keep their place
    return [output, SimpleNamespace(**{**vars(output), "num_scheduled_tokens": swapped})]


def measure(quick: bool = False) -> dict[str, Any]:
    """The wrapper's CPU per step, bare and with otel_llm, for steps re-admitting 0, 1 and 4 requests,
    and for plain decode steps whose batch changed every step."""
    receiver = FrontendFigures(os.getpid(), 0)
    # An engine core's instrumentation: no frontend (no adapter) in this process.
    state = IntegrationState(None, {}, Faults("vllm", "vLLM", log, lambda: "benchmark"))
    sender = state.engine_core_figures = EngineCoreFigures()
    sender._parent = os.getpid()  # this process stands in for the frontend
    try:
        variants = {}
        for resumed in (0, 1, 4):
            scheduler, output = scheduler_and_outputs(resumed)

            def bare(self: Any, output: Any = output) -> Any:
                return output

            wrapped = read_each_step(state, bare)
            steps = QUICK_STEPS if quick else STEPS
            variants[("bare", resumed)] = _round(bare, scheduler, receiver, sender, set(), steps)
            variants[("figures", resumed)] = _round(wrapped, scheduler, receiver, sender, set(), steps)
            variants[("steps", resumed)] = _round(wrapped, scheduler, receiver, sender, {0}, steps)
        scheduler, output = scheduler_and_outputs(0)
        turns = itertools.cycle(changed_every_step(output))

        def alternating(self: Any, turns: Any = turns) -> Any:
            return next(turns)

        wrapped = read_each_step(state, alternating)
        variants[("bare", "changed")] = _round(alternating, scheduler, receiver, sender, set(), steps)
        variants[("steps", "changed")] = _round(wrapped, scheduler, receiver, sender, {0}, steps)
        # The frontend's side, as each batch of outputs arrives: a read of the socket and the steps taken.
        _, decode_step = scheduler_and_outputs(0)
        line = (1000.0, decode_step.num_scheduled_tokens, decode_step.total_num_scheduled_tokens, None)
        other = changed_every_step(decode_step)[1].num_scheduled_tokens
        for what in ("clock", "empty", "step", "changed"):
            variants[("read", what)] = _reading(receiver, sender, what, line, steps, other)
        timings = compare({f"{k[0]}-{k[1]}": v for k, v in variants.items()}, 3 if quick else ROUNDS)
    finally:
        receiver.close()
    rows = []
    for resumed in (0, 1, 4):
        bare_ns = timings[f"bare-{resumed}"].median_ns
        rows.append(
            {
                "resumed": resumed,
                "bare_ns": bare_ns,
                "added_ns": timings[f"figures-{resumed}"].median_ns - bare_ns,
                "added_with_steps_ns": timings[f"steps-{resumed}"].median_ns - bare_ns,
            }
        )
    clock_ns = timings["read-clock"].median_ns
    return {
        "rows": rows,
        "changed_bare_ns": timings["bare-changed"].median_ns,
        "changed_added_ns": timings["steps-changed"].median_ns - timings["bare-changed"].median_ns,
        "read_changed_ns": timings["read-changed"].median_ns - clock_ns,
        "read_empty_ns": timings["read-empty"].median_ns - clock_ns,
        "read_step_ns": timings["read-step"].median_ns - clock_ns,
        "sent": sender.sent,
        "lost": sender.lost + sender.steps_lost,
        "received": receiver.received,
        "steps_sent": sender.steps_sent,
    }


def _round(
    schedule: Any,
    scheduler: Any,
    receiver: FrontendFigures,
    sender: EngineCoreFigures,
    clients: set[int],
    steps: int,
) -> Any:
    def run() -> tuple[int, int]:
        sender.clients = clients  # none known: the reschedulings' figures alone
        clock = time.process_time_ns
        elapsed = 0
        for _ in range(steps // DRAIN_EVERY):
            start = clock()
            for _ in range(DRAIN_EVERY):
                schedule(scheduler)
            elapsed += clock() - start
            receiver.drain()  # untimed: the frontend's work, not the engine core's
            receiver.take_steps()
        return elapsed, steps

    return run


def _reading(
    receiver: FrontendFigures, sender: EngineCoreFigures, what: str, line: Any, steps: int, other: Any
) -> Any:
    """The frontend's read per batch of outputs (``drain`` and ``take_steps``): with nothing written
    (``empty``), or after the engine core wrote one decode step's line (``step``: the same batch each
    time; ``changed``: ``line`` and ``other``'s ids in turn, named in full; the write untimed);
    ``clock``: the two clock reads alone, taken off both."""
    lines = [line, (line[0], other, *line[2:])] if what == "changed" else [line]

    def run() -> tuple[int, int]:
        sender.clients = {0}
        clock = time.process_time_ns
        elapsed = 0
        for k in range(steps):
            if what in ("step", "changed"):
                sender.send([], lines[k % len(lines)])
            start = clock()
            if what != "clock":
                receiver.drain()
                receiver.take_steps()
            elapsed += clock() - start
        receiver.drain()
        receiver.take_steps()
        return elapsed, steps

    return run


def lines(result: dict[str, Any]) -> list[str]:
    out = [
        "## otel_llm in vLLM's engine core: each step's added CPU",
        "",
        f"`python -m benchmarks.engine_core_figures` ({STEPS} steps a round, {ROUNDS} rounds, a batch of "
        f"{BATCH} requests; its docstring has the method). CPU per `schedule()` call; the added part is "
        "the wrapper's: the check for re-admitted requests and, when there are some, one write of "
        "their figures to the frontend (to the ring of shared memory it was handed, once connected); then, "
        "with a frontend known (as always once a request came), the step's line for the frontend's stall "
        "figures, every step, in the same write. Target for the step line (issue 44): at most 2 µs per "
        "decode step. Target for the figures "
        "(issue 29): at most 2 µs per re-admitted request, nothing on a plain step; the step line is the "
        "cost of stall figures under `vllm serve` (issue 31).",
        "",
        "| re-admitted in the step | bare `schedule()` | added: figures | added per re-admitted request "
        "| added: figures and the step line |",
        "|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        per = f"{row['added_ns'] / row['resumed'] / 1000:.2f} µs" if row["resumed"] else "-"
        out.append(
            f"| {row['resumed']} | {row['bare_ns']:.0f} ns | {row['added_ns'] / 1000:.2f} µs | {per} "
            f"| {row['added_with_steps_ns'] / 1000:.2f} µs |"
        )
    out.append(
        f"| 0, the batch changed every step | {result['changed_bare_ns']:.0f} ns | - | - "
        f"| {result['changed_added_ns'] / 1000:.2f} µs |"
    )
    out += [
        "",
        "A decode step whose requests are those of the step before writes `=` for their ids (the rows "
        "above but the last); one whose batch changed names them all (the last row).",
        "",
        "In the frontend, as each batch of outputs arrives (the same process as vLLM's output loop): a read "
        f"of the socket with nothing written {result['read_empty_ns'] / 1000:.2f} µs; reading one "
        f"decode step's line of {BATCH} requests and taking the step {result['read_step_ns'] / 1000:.2f} µs "
        f"when its batch did not change, {result['read_changed_ns'] / 1000:.2f} µs when it did.",
        "",
        f"Figures sent {result['sent']}, step lines {result['steps_sent']}, lost {result['lost']}, "
        f"figures received {result['received']}.",
    ]
    return out


def main() -> None:
    import sys

    print("\n".join(lines(measure("--quick" in sys.argv[1:]))))


if __name__ == "__main__":
    main()
