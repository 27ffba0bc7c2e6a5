"""Section 2: the cost of finishing a request, and of a whole request.

``finished()`` builds every span, event and request metric of the request. It is compared with building
the same spans (same count, same explicit times, same events and root attributes) directly with the SDK
tracer, and no metrics at all: the floor for any library that emits this trace. The whole request
(queued, scheduled, every tokens step in a batch, the preemption, finished) is compared with the naive
OpenTelemetry peer and the vLLM way. All timestamps are explicit monotonic seconds (a simulated clock,
10 ms per step), so every variant builds identical timelines; providers discard exported spans.
"""

from __future__ import annotations

import itertools
import time
import types
from collections.abc import Callable
from typing import Any

from opentelemetry import metrics, trace

from benchmarks.peers import NaiveOtel, VllmProm
from benchmarks.providers import discarding_providers
from benchmarks.report import Measure
from benchmarks.timing import Round, compare, perf_ns
from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.hooks import stalls as stall_finder

STEP_S = 0.010
_tags = itertools.count()


def drive(
    hook: Any,
    ids: list[str],
    tokens: int,
    preempt: bool,
    t0: float,
    finish: bool = True,
    batches: bool = False,
) -> float:
    """Run ``ids`` as one batch from queued to (optionally) finished; return the finish timestamp.
    ``batches``: the engine reports each step (``batch()``), and every 50th step takes five times as
    long (stalls for every request to explain)."""
    for rid in ids:
        hook.queued(rid, ts=t0)
    ts = t0 + STEP_S
    hook.scheduled(ids, ts=ts)
    decode = dict.fromkeys(ids, 1)
    for step in range(tokens):
        if batches:
            hook.batch(decode, ts=ts)
            if step % 50 == 49:
                ts += 4 * STEP_S
        ts += STEP_S
        hook.tokens(ids, ts=ts)
        if preempt and step == tokens // 2:
            hook.preempted(ids, ts=ts + STEP_S / 4)
            ts += STEP_S
            hook.scheduled(ids, ts=ts)
    end = ts + STEP_S / 2
    if finish:
        for rid in ids:
            hook.finished(rid, ts=end)
    return end


class BareSdkSpans:
    """The same spans and events built straight with the SDK tracer, from precomputed numbers."""

    def __init__(self, tracer_provider: Any, tokens: int, preempt: bool, t0: float) -> None:
        self.tracer = tracer_provider.get_tracer("bare-sdk")
        ns = lambda s: int(s * 1e9)  # noqa: E731  (absolute times only need to be consistent here)
        q, s1, first = ns(t0), ns(t0 + STEP_S), ns(t0 + 2 * STEP_S)
        end = ns(t0 + (tokens + 1 + (1 if preempt else 0)) * STEP_S + STEP_S / 2)
        p = ns(t0 + (tokens // 2 + 2) * STEP_S + STEP_S / 4)
        r = ns(t0 + (tokens // 2 + 3) * STEP_S)
        self.times = (q, s1, first, end, p, r, r + ns(STEP_S))
        self.preempt = preempt
        self.attrs = {
            sc.GEN_AI_PROVIDER_NAME: "otel_llm",
            sc.GEN_AI_OPERATION_NAME: "text_completion",
            sc.GEN_AI_REQUEST_MODEL: "bench-model",
            sc.LLM_REQUEST_ID: "req",
            sc.GEN_AI_USAGE_INPUT_TOKENS: 12,
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: tokens,
            sc.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",),
            sc.LLM_PREEMPTIONS: int(preempt),
            sc.LLM_LATENCY_QUEUE: 0.01,
            sc.LLM_LATENCY_PREFILL: 0.01,
            sc.LLM_LATENCY_DECODE: 1.0,
            sc.LLM_LATENCY_INFERENCE: 1.0,
            sc.LLM_LATENCY_TTFT: 0.02,
            sc.LLM_LATENCY_E2E: 1.0,
        }

    def finished(self, request_id: Any) -> None:
        q, s1, first, end, p, r, t = self.times
        start = self.tracer.start_span
        root = start(sc.SPAN_REQUEST, kind=trace.SpanKind.SERVER, attributes=self.attrs, start_time=q)
        ctx = trace.set_span_in_context(root)
        start(sc.SPAN_QUEUE, context=ctx, start_time=q).end(end_time=s1)
        start(sc.SPAN_PREFILL, context=ctx, start_time=s1).end(end_time=first)
        decode = start(sc.SPAN_DECODE, context=ctx, start_time=first)
        root.add_event(sc.EVENT_QUEUED, timestamp=q)
        root.add_event(sc.EVENT_SCHEDULED, {sc.LLM_RESUMED: False}, timestamp=s1)
        root.add_event(sc.EVENT_FIRST_TOKEN, timestamp=first)
        if self.preempt:
            dctx = trace.set_span_in_context(decode)
            start(sc.SPAN_PREEMPTED, context=dctx, start_time=p).end(end_time=r)
            start(sc.SPAN_RECOMPUTE, context=dctx, start_time=r).end(end_time=t)
            root.add_event(sc.EVENT_PREEMPTED, {sc.LLM_OUTPUT_TOKENS: 1}, timestamp=p)
            root.add_event(sc.EVENT_SCHEDULED, {sc.LLM_RESUMED: True}, timestamp=r)
        decode.end(end_time=end)
        root.end(end_time=end)


def finishing(
    tracker: RequestTracker,
    batch: int,
    tokens: int,
    preempt: bool,
    batches: bool = False,
    clock: Callable[[], int] = perf_ns,
) -> Round:
    """A round timing only the ``finished()`` calls of ``batch`` requests driven through ``tokens``
    steps (``drive``), on ``clock`` (nanoseconds)."""

    def run() -> tuple[int, int]:
        tag = next(_tags)
        ids = [f"req-{tag}-{i}" for i in range(batch)]
        # Each round after the last has ended: the tracker's step logs stay in time order, as an engine's
        # do (a round of N steps spans about 1.1 N steps of STEP_S).
        start_at = 100.0 + tag * (20.0 + 1.2 * STEP_S * tokens)
        end = drive(tracker, ids, tokens, preempt, start_at, finish=False, batches=batches)
        finished = tracker.finished
        start = clock()
        for rid in ids:
            finished(rid, ts=end)
        return clock() - start, batch

    return run


def finish_rounds(batch: int, tokens: int, preempt: bool, split: bool = False) -> dict[str, Round]:
    """``split`` adds ours with only spans (no-op meter) and only metrics (no-op tracer)."""
    ours_p, bare_p = discarding_providers(), discarding_providers()
    trackers = {
        "ours": RequestTracker(
            tracer_provider=ours_p.tracer_provider, meter_provider=ours_p.meter_provider, model="bench-model"
        )
    }
    if split:
        trackers["ours, spans only"] = RequestTracker(
            tracer_provider=ours_p.tracer_provider,
            meter_provider=metrics.NoOpMeterProvider(),
            model="bench-model",
        )
        trackers["ours, metrics only"] = RequestTracker(
            tracer_provider=trace.NoOpTracerProvider(),
            meter_provider=ours_p.meter_provider,
            model="bench-model",
        )
    bare = BareSdkSpans(bare_p.tracer_provider, tokens, preempt, 100.0)

    def bare_sdk() -> tuple[int, int]:
        finished = bare.finished
        start = perf_ns()
        for i in range(batch):
            finished(i)
        return perf_ns() - start, batch

    made = {name: finishing(t, batch, tokens, preempt) for name, t in trackers.items()}
    return {**made, "bare SDK spans": bare_sdk}


EXACT_PATH = "with batch(), every request's stalls over its token times"
NO_ENGINE_TIME = "with batch(), its stalls but not its engine time"


def stall_rounds(batch: int, tokens: int) -> dict[str, Round]:
    """finished() after ``tokens`` decode steps, without and with ``batch()`` (its stalls found and its
    engine time), with ``batch()`` but no engine time, and with ``batch()`` where every request takes
    the stall finder's exact path (``stalls.find`` over its
    token times, as before the log's gap index; ``find_logged`` otherwise). CPU time of the finishing
    thread: a round is short, and another job taking the core away would land in one variant."""
    made = {}
    for name in ("without batch()", "with batch()", EXACT_PATH, NO_ENGINE_TIME):
        p = discarding_providers()
        made[name] = RequestTracker(tracer_provider=p.tracer_provider, meter_provider=p.meter_provider)
    made[EXACT_PATH]._stalls = types.MethodType(_exact_stalls, made[EXACT_PATH])  # type: ignore[method-assign]
    # What the engine time adds to a finish: the same tracker without it.
    made[NO_ENGINE_TIME]._engine_time = lambda fin, batches: None  # type: ignore[method-assign]
    return {
        name: finishing(t, batch, tokens, False, name != "without batch()", time.thread_time_ns)
        for name, t in made.items()
    }


def _exact_stalls(self: Any, fin: Any, batches: Any) -> Any:
    first, last = fin.timeline.first_token, fin.last_token
    if first is None or last is None:
        return (), ()
    with self._lock:
        steps, ends, partial = batches.between(first, last)
        log_start = batches.oldest_start()
    return stall_finder.find(fin, steps, ends, partial, log_start)


def whole_rounds(batch: int, tokens: int, preempt: bool) -> dict[str, Round]:
    ours_p, naive_p = discarding_providers(), discarding_providers()
    made = {
        "ours": RequestTracker(
            tracer_provider=ours_p.tracer_provider, meter_provider=ours_p.meter_provider, model="bench-model"
        ),
        "naive OpenTelemetry": NaiveOtel(naive_p.tracer_provider, naive_p.meter_provider),
        "vLLM way (prometheus_client, no traces)": VllmProm(),
    }

    def whole(hook: Any) -> Round:
        def run() -> tuple[int, int]:
            tag = next(_tags)
            ids = [f"req-{tag}-{i}" for i in range(batch)]
            start = perf_ns()
            drive(hook, ids, tokens, preempt, 100.0)
            return perf_ns() - start, batch

        return run

    return {name: whole(hook) for name, hook in made.items()}


def run(quick: bool, rounds: int) -> list[Measure]:
    out: list[Measure] = []
    batch = 4 if quick else 64
    for tokens in (16, 128, 1024):
        for preempt in (False, True):
            what = f"{tokens} output tokens" + (", 1 preemption" if preempt else "")
            split = tokens == 128 and not preempt
            t = compare(finish_rounds(batch, tokens, preempt, split), rounds)
            out.append(
                Measure(
                    "finish",
                    f"finished(), {what}",
                    "ns",
                    t["ours"].median_ns,
                    {"bare SDK spans": t["bare SDK spans"].median_ns},
                    spread=(t["ours"].low_ns, t["ours"].high_ns),
                )
            )
            if split:
                for part in ("spans only", "metrics only"):
                    out.append(
                        Measure(
                            "finish",
                            f"finished(), {what}, {part} (other provider no-op)",
                            "ns",
                            t[f"ours, {part}"].median_ns,
                            {"bare SDK spans": t["bare SDK spans"].median_ns},
                        )
                    )
            t = compare(whole_rounds(batch, tokens, preempt), rounds)
            out.append(
                Measure(
                    "finish",
                    f"whole request, {what}",
                    "ns",
                    t["ours"].median_ns,
                    {name: t[name].median_ns for name in t if name != "ours"},
                    spread=(t["ours"].low_ns, t["ours"].high_ns),
                )
            )
    for tokens in (20, 100) if quick else (200, 1000, 10000):
        t = compare(stall_rounds(batch, tokens), rounds)
        out.append(
            Measure(
                "finish",
                f"finished() after {tokens} decode steps, the engine reporting its batches (batch())",
                "ns",
                t["with batch()"].median_ns,
                {
                    "without batch()": t["without batch()"].median_ns,
                    NO_ENGINE_TIME: t[NO_ENGINE_TIME].median_ns,
                    EXACT_PATH: t[EXACT_PATH].median_ns,
                },
                spread=(t["with batch()"].low_ns, t["with batch()"].high_ns),
                note="every 50th step five times as long: each request's stalls found and put on its trace; "
                "CPU time of the finishing thread",
            )
        )
    return out
