"""Section 1: the hook's cost per request-token in a decode loop.

Each round queues a fresh batch, schedules it, then runs ``steps`` engine steps in which every request
produces one token; every ``PREEMPT_EVERY`` steps one request is preempted after its token and
rescheduled before the next step's tokens (vLLM's recompute preemption). The batch is listed in a new
order at each step (every request takes the tracker's per-request path) and, beside it for ours and the
bare limit, as the same batch every step (the tracker advances it at once). Only the step loop is timed;
queueing and finishing (span building) happen outside it. Cost = loop time / (steps x batch).

Beside it, ``scheduled()`` alone at reschedulings, without and with ``cached_tokens`` (the figures of
what a recompute costs, ``otel_llm.recompute``): the no-argument path must cost what it did before.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from opentelemetry import metrics, trace

from benchmarks.peers import BareLimit, NaiveOtel, VllmProm
from benchmarks.providers import discarding_providers
from benchmarks.report import Measure
from benchmarks.timing import Round, compare, perf_ns
from otel_llm import RequestTracker

STEADY = "the same batch every step"
PREEMPT_EVERY = 16  # one preemption per 16 steps across the batch: occasional, as in a loaded server
_round_ids = itertools.count()


def decode_round(hook: Any, batch: int, steps: int, steady: bool = False) -> Round:
    """One timed round of the decode loop over ``hook`` (anything with the five-call hook).

    By default the batch's order alternates between two steps, so no step lists the same batch as the
    previous one and every request takes the tracker's per-request path (as when requests join and
    leave at every step); ``steady`` lists one batch every step, which the tracker advances at once."""

    def run() -> tuple[int, int]:
        tag = next(_round_ids)
        ids = [f"req-{tag}-{i}" for i in range(batch)]
        for rid in ids:
            hook.queued(rid)
        hook.scheduled(ids)
        scheduled, tokens, preempted = hook.scheduled, hook.tokens, hook.preempted
        orders = (ids, ids) if steady else (ids, ids[1:] + ids[:1])
        victim: list[str] = []
        start = perf_ns()
        for step in range(steps):
            if victim:
                scheduled(victim)
            tokens(orders[step & 1])
            if step % PREEMPT_EVERY == PREEMPT_EVERY - 1:
                victim = [ids[step % batch]]
                preempted(victim)
            else:
                victim = []
        elapsed = perf_ns() - start
        if victim:
            scheduled(victim)
        for rid in ids:
            hook.finished(rid)
        return elapsed, steps * batch

    return run


RESCHEDULED_BATCH = 16  # requests an engine step re-admits at once after preempting them
CACHED = 48  # prefix-cache hits reported per rescheduled request (of a 64-token prompt)


def rescheduling_round(tracker: RequestTracker, cycles: int, cached: bool) -> Round:
    """One timed round of reschedulings: ``cycles`` times, the whole batch is preempted (untimed), then
    re-admitted by one ``scheduled()`` call (timed), with or without ``cached_tokens``. Cost = time in
    ``scheduled()`` / reschedulings. Each round uses fresh requests, under the preemption span cap."""
    figures = [CACHED] * RESCHEDULED_BATCH

    def run() -> tuple[int, int]:
        tag = next(_round_ids)
        ids = [f"resched-{tag}-{i}" for i in range(RESCHEDULED_BATCH)]
        for rid in ids:
            tracker.queued(rid, prompt_tokens=64)
        tracker.scheduled(ids)
        tracker.tokens(ids)
        scheduled, preempted = tracker.scheduled, tracker.preempted
        elapsed = 0
        for _ in range(cycles):
            preempted(ids)
            if cached:
                start = perf_ns()
                scheduled(ids, None, figures)
                elapsed += perf_ns() - start
            else:
                start = perf_ns()
                scheduled(ids)
                elapsed += perf_ns() - start
        for rid in ids:
            tracker.finished(rid)
        return elapsed, cycles * RESCHEDULED_BATCH

    return run


def rescheduling(quick: bool, rounds: int) -> Measure:
    """scheduled() per rescheduled request, without cached_tokens (ours) and with it (the peer)."""
    providers = discarding_providers()
    try:
        cycles = 4 if quick else 30  # at most 32 preemptions a request get spans: stay under the cap
        variants = {}
        for name, cached in (("without", False), ("with", True)):
            tracker = RequestTracker(
                tracer_provider=providers.tracer_provider,
                meter_provider=providers.meter_provider,
                model="bench-model",
            )
            variants[name] = rescheduling_round(tracker, cycles, cached)
        t = compare(variants, rounds * (1 if quick else 5))
    finally:
        providers.shutdown()
    return Measure(
        "hook",
        f"scheduled() per rescheduled request, batch {RESCHEDULED_BATCH}, without cached_tokens",
        "ns",
        t["without"].median_ns,
        {"with cached_tokens (recompute figures)": t["with"].median_ns},
        spread=(t["without"].low_ns, t["without"].high_ns),
        note="the no-argument path is the code it was before the recompute figures; the peer is the "
        "price of reporting them",
    )


PREFILL_CHUNK = 512  # tokens of the prompt chunk that shares every step of the "with prefill" variant


def batch_round(tracker: RequestTracker, batch: int, steps: int, report: str | None) -> Round:
    """One timed round of a steady decode batch: ``tokens()`` every step and, with ``report``, the step's
    ``batch()`` before it (``"decode"``: every request one token; ``"prefill"``: plus another request's
    prompt chunk of ``PREFILL_CHUNK`` tokens, a step with chunked prefill). Cost = loop time / (steps x
    batch), so the batch() variants' excess over None is batch()'s share per request-token."""

    def run() -> tuple[int, int]:
        tag = next(_round_ids)
        ids = [f"batch-{tag}-{i}" for i in range(batch)]
        # The prompt being prefilled in chunks (running, in every step), for the "prefill" variant only:
        # elsewhere every running request is in the step, as in an engine's plain decode step.
        everyone = [*ids, f"batch-{tag}-prompt"] if report == "prefill" else ids
        for rid in everyone:
            tracker.queued(rid)
        tracker.scheduled(everyone)
        tracker.tokens(ids)  # past their first token: decoding
        composition = dict.fromkeys(ids, 1)
        if report == "prefill":
            composition[everyone[-1]] = PREFILL_CHUNK
        tokens, step_batch = tracker.tokens, tracker.batch
        start = perf_ns()
        if report is None:
            for _ in range(steps):
                tokens(ids)
        else:
            for _ in range(steps):
                step_batch(composition)
                tokens(ids)
        elapsed = perf_ns() - start
        for rid in everyone:
            tracker.finished(rid)
        return elapsed, steps * batch

    return run


def batch_reports(quick: bool, rounds: int) -> list[Measure]:
    """The steady decode loop without batch(), and with it (pure decode steps; steps with a prefill
    chunk), per request-token."""
    providers = discarding_providers()
    out = []
    try:
        for batch in (64, 256):
            steps = (2_000 if quick else 40_000) // batch
            variants = {}
            for name, report in (("without", None), ("decode", "decode"), ("prefill", "prefill")):
                tracker = RequestTracker(
                    tracer_provider=providers.tracer_provider,
                    meter_provider=providers.meter_provider,
                    model="bench-model",
                )
                variants[name] = batch_round(tracker, batch, steps, report)
            t = compare(variants, rounds)
            out.append(
                Measure(
                    "hook",
                    f"hook cost per request-token, batch {batch}, {STEADY}, without batch()",
                    "ns",
                    t["without"].median_ns,
                    {
                        "with batch(), decode steps": t["decode"].median_ns,
                        f"with batch(), a {PREFILL_CHUNK}-token prefill chunk in each step": t[
                            "prefill"
                        ].median_ns,
                    },
                    spread=(t["without"].low_ns, t["without"].high_ns),
                    note="batch() is optional (stalls explained); without it tokens() pays one None check",
                )
            )
    finally:
        providers.shutdown()
    return out


ENGINE_STEP_S = 0.033  # an engine's step, for the detail-level rounds: windows of engine steps close by it


def detail_round(tracker: RequestTracker, batch: int, steps: int, report: bool) -> Round:
    """One timed round of a steady decode batch on an engine's clock (explicit timestamps, one step
    every ``ENGINE_STEP_S``, so that windows of the engine's own step spans open and close as they
    would), with ``batch()`` before each step when ``report`` (another request's prompt chunk in every
    step). Cost = loop time / (steps x batch)."""

    def run() -> tuple[int, int]:
        tag = next(_round_ids)
        ids = [f"detail-{tag}-{i}" for i in range(batch)]
        everyone = [*ids, f"detail-{tag}-prompt"] if report else ids
        ts = 1_000.0 + tag * (steps + 10) * ENGINE_STEP_S  # each round after the previous one
        for rid in everyone:
            tracker.queued(rid, ts=ts)
        tracker.scheduled(everyone, ts=ts)
        ts += ENGINE_STEP_S
        tracker.tokens(ids, ts=ts)
        composition = dict.fromkeys(ids, 1)
        if report:
            composition[everyone[-1]] = PREFILL_CHUNK
        tokens, step_batch = tracker.tokens, tracker.batch
        stamps = [ts + (k + 1) * ENGINE_STEP_S for k in range(steps)]
        start = perf_ns()
        if report:
            for at in stamps:
                step_batch(composition, ts=at - ENGINE_STEP_S)
                tokens(ids, ts=at)
        else:
            for at in stamps:
                tokens(ids, ts=at)
        elapsed = perf_ns() - start
        for rid in everyone:
            tracker.finished(rid, ts=stamps[-1])
        return elapsed, steps * batch

    return run


def detail_steps_reports(quick: bool, rounds: int) -> list[Measure]:
    """The steady decode loop at detail ``steps`` (a step log, and the engine's own step spans in
    windows) beside detail ``phases``, per request-token, on an engine's clock."""
    providers = discarding_providers()
    out = []
    try:
        for batch in (64, 256):
            steps = (2_000 if quick else 40_000) // batch
            variants = {}
            for name, detail, report in (
                ("phases", "phases", False),
                ("steps", "steps", False),
                ("steps, batch()", "steps", True),
            ):
                tracker = RequestTracker(
                    tracer_provider=providers.tracer_provider,
                    meter_provider=providers.meter_provider,
                    model="bench-model",
                    trace_detail=detail,
                )
                variants[name] = detail_round(tracker, batch, steps, report)
            t = compare(variants, rounds)
            out.append(
                Measure(
                    "hook",
                    f"hook cost per request-token, batch {batch}, {STEADY}, detail steps, one step every "
                    f"{ENGINE_STEP_S * 1000:.0f} ms",
                    "ns",
                    t["steps"].median_ns,
                    {
                        "detail phases": t["phases"].median_ns,
                        f"detail steps with batch(), a {PREFILL_CHUNK}-token prefill chunk in each step": t[
                            "steps, batch()"
                        ].median_ns,
                    },
                    spread=(t["steps"].low_ns, t["steps"].high_ns),
                    note="a step record per step; the first 128 steps of every 10 s window get an engine "
                    "step span's ids and links (a C-level pass over its requests)",
                )
            )
    finally:
        providers.shutdown()
    return out


def hooks() -> tuple[dict[str, Callable[[], Any]], Callable[[], None]]:
    """Factories of every variant, and a cleanup for the providers they share."""
    ours = discarding_providers()
    naive = discarding_providers()
    made = {
        "ours": lambda: RequestTracker(
            tracer_provider=ours.tracer_provider, meter_provider=ours.meter_provider, model="bench-model"
        ),
        "ours, no-op providers": lambda: RequestTracker(
            tracer_provider=trace.NoOpTracerProvider(),
            meter_provider=metrics.NoOpMeterProvider(),
            model="bench-model",
        ),
        "bare limit": BareLimit,
        "vLLM way (prometheus_client)": VllmProm,
        "naive OpenTelemetry": lambda: NaiveOtel(naive.tracer_provider, naive.meter_provider),
    }

    def close() -> None:
        ours.shutdown()
        naive.shutdown()

    return made, close


def run(quick: bool, rounds: int) -> list[Measure]:
    batches = (1, 64, 256)
    tokens_per_round = 2_000 if quick else 40_000
    factories, close = hooks()
    out: list[Measure] = []
    try:
        for batch in batches:
            steps = max(PREEMPT_EVERY * 2, tokens_per_round // batch)
            variants = {name: decode_round(make(), batch, steps) for name, make in factories.items()}
            for name in ("ours", "bare limit"):
                variants[f"{name}, {STEADY}"] = decode_round(factories[name](), batch, steps, steady=True)
            t = compare(variants, rounds)
            label = f"hook cost per request-token, batch {batch}"
            ours = t["ours"].median_ns
            out.append(
                Measure(
                    "hook",
                    label,
                    "ns",
                    ours,
                    {
                        name: t[name].median_ns
                        for name in ("bare limit", "vLLM way (prometheus_client)", "naive OpenTelemetry")
                    },
                    spread=(t["ours"].low_ns, t["ours"].high_ns),
                )
            )
            out.append(
                Measure(
                    "hook",
                    f"{label}, {STEADY}",
                    "ns",
                    t[f"ours, {STEADY}"].median_ns,
                    {"bare limit": t[f"bare limit, {STEADY}"].median_ns},
                    spread=(t[f"ours, {STEADY}"].low_ns, t[f"ours, {STEADY}"].high_ns),
                    note="the tracker moves the batch's shared step once; the rows above list the batch "
                    "in a new order at every step, so each request takes the per-request path",
                )
            )
            out.append(
                Measure(
                    "hook",
                    f"hook cost per request-token with no-op providers, batch {batch}",
                    "ns",
                    t["ours, no-op providers"].median_ns,
                    {"bare limit": t["bare limit"].median_ns},
                    spread=(t["ours, no-op providers"].low_ns, t["ours, no-op providers"].high_ns),
                )
            )
    finally:
        close()
    out.append(rescheduling(quick, rounds))
    out += batch_reports(quick, rounds)
    out += detail_steps_reports(quick, rounds)
    return out
