"""Section 7: tail sampling and trace detail levels, side by side in one run.

(a) The reference engine at batch 64 (benchmarks/engine.py's workload, which preempts): steps per second
    without a tracker, with one keeping every trace, and with tail sampling keeping 5 % plus the failed,
    preempted and slow ones (TTFT over 1 s, end to end over 10 s), runs interleaved. Each setting twice:
    on SDK providers that discard (spans built on the engine's thread, export mode ``in_process``), and
    on ``configure(export_mode="process")``'s providers exporting OTLP/gRPC to a receiver in a process
    of its own (the engine's thread only hands each finished request's record to the export process;
    flushed after each run, outside its clock).
(b) finished() of a 128-token request, 64 at a time (benchmarks/finish.py's driver): tail sampling off
    (today's path), on and keeping the request, on and dropping it; the bare SDK spans as the floor.
(c) For each detail level x {every trace, tail 5 % + preempted + slow}: the reference engine's run
    exporting through an exporter that encodes every span batch as an OTLP protobuf request (what an OTLP
    exporter sends, before compression) and discards it; spans and bytes per second of engine run time,
    and per request.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from benchmarks.engine import one_run
from benchmarks.finish import BareSdkSpans, _tags, drive
from benchmarks.providers import discarding_providers
from benchmarks.report import Measure
from benchmarks.timing import compare, perf_ns
from otel_llm import RequestTracker
from otel_llm.emit.sampling import TailSampling
from otel_llm.record import DETAILS

TAIL = TailSampling(ratio=0.05, ttft_s=1.0, e2e_s=10.0)
SETTINGS = {"every trace": False, "tail 5 % + preempted + slow": TAIL}
EXPORT_PROCESS = ", export process"  # the suffix of the settings' names in export mode process


class OtlpSizeExporter(SpanExporter):
    """Encodes each batch as an OTLP ExportTraceServiceRequest (protobuf) and counts spans and bytes."""

    def __init__(self) -> None:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        self._encode = encode_spans
        self.spans = 0
        self.bytes = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        self.bytes += len(self._encode(spans).SerializeToString())
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


# The engine's KV pool decides how many requests are preempted, and tail sampling keeps every preempted
# one, so the same 96 requests of 24 tokens run twice: with the stress pool of section 5 (about a third
# preempted) and with a pool where a few are (the rate a provisioned deployment sees). What every request
# pays (its queued / finished, a kept one's spans) is spread over its tokens, so a third run has requests
# of 128 tokens, nearer what chat serving produces, again with a few preempted.
# name -> (KV blocks of 16 tokens, output tokens per request)
WORKLOADS = {
    "stress pool (160 KV blocks)": (160, 24),
    "pool with few preemptions (220 KV blocks)": (220, 24),
    "128-token requests, pool with few preemptions (600 KV blocks)": (600, 128),
}
TIMING_COST = "share of the engine's run time that timing the hooks costs"
HOOKS = ("queued", "scheduled", "tokens", "preempted", "finished", "engine_state")


class TimedHooks:
    """Forwards to a RequestTracker and adds up the perf_counter time spent inside its engine hooks.

    Used in separate runs from the steps-per-second ones. The forwarding and timing cost a little and
    are counted in, so the share it gives errs high; ``NullHooks`` timed the same way measures how much."""

    def __init__(self, tracker: Any) -> None:
        self._tracker = tracker
        self.seconds = 0.0
        self.by_hook: dict[str, float] = dict.fromkeys(HOOKS, 0.0)
        self.request_tokens = 0  # request ids passed to tokens(): one per request per step
        for name in HOOKS:
            setattr(self, name, self._timed(name, getattr(tracker, name)))

    def _timed(self, name: str, hook: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if name == "tokens":
                self.request_tokens += len(args[0])
            start = time.perf_counter()
            try:
                return hook(*args, **kwargs)
            finally:
                took = time.perf_counter() - start
                self.seconds += took
                self.by_hook[name] += took

        return call

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tracker, name)


class NullHooks:
    """Engine hooks that do nothing: under TimedHooks, the timing's own share of a run."""

    def queued(self, *args: Any, **kwargs: Any) -> None:
        pass

    scheduled = tokens = preempted = finished = engine_state = queued

    def traceparent(self, request_id: Any) -> None:
        return None


def _split(shares: dict[str, list[float]]) -> str:
    """The median share of the run inside each hook, largest first."""
    parts = sorted(((statistics.median(v), hook) for hook, v in shares.items() if v), reverse=True)
    inside = ", ".join(f"{hook} {share * 100:.2f} %" for share, hook in parts if share >= 0.00005)
    return f"inside each hook: {inside}; queued runs before the run's clock starts and is counted in"


class ExportProcessPipeline:
    """``configure(export_mode="process")`` exporting OTLP/gRPC to a receiver in its own process."""

    def __init__(self) -> None:
        from benchmarks.end_to_end import Receiver, otlp_env
        from otel_llm import configure

        self.receiver = Receiver()
        with otlp_env(self.receiver.port):
            self.telemetry = configure(
                set_global=False, service_name="bench-sampling", export_mode="process", shutdown_timeout_s=30
            )

    def spans(self) -> int:
        """Spans the receiver has decoded so far, once every record sent is exported."""
        self.telemetry.force_flush(timeout_s=60)
        return int(self.receiver.ask("spans"))

    def close(self) -> None:
        self.telemetry.shutdown(timeout_s=30)
        self.receiver.close()


def _engine_rates(quick: bool, rounds: int) -> list[Measure]:
    providers = discarding_providers()
    exported = ExportProcessPipeline()
    requests = 8 if quick else 96
    rounds = rounds if quick else 3 * rounds  # 0.2 s runs whose spread is +-20 % on shared cores
    one_run(None, requests, 4 if quick else 24)  # warm-up
    variants: dict[str, Any] = {
        "without the tracker": None,
        **SETTINGS,
        **{name + EXPORT_PROCESS: setting for name, setting in SETTINGS.items()},
    }
    wall: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    share: dict[tuple[str, str], list[float]] = {}
    by_hook: dict[tuple[str, str], dict[str, list[float]]] = {}
    wrapper: dict[str, list[float]] = {}  # the timing's own share of a run, per workload
    per_token: list[float] = []  # tokens() per request id, inside the engine's loop (ns)
    spans: dict[tuple[str, str], int] = {}
    preemptions: dict[str, int] = {}

    def tracker_for(name: str, setting: Any) -> RequestTracker:
        pipeline: Any = exported.telemetry if name.endswith(EXPORT_PROCESS) else providers
        return RequestTracker(
            tracer_provider=pipeline.tracer_provider,
            meter_provider=pipeline.meter_provider,
            model="tiny",
            tail_sampling=setting,
            trace_detail="phases",
        )

    def spans_so_far(name: str) -> int:
        return exported.spans() if name.endswith(EXPORT_PROCESS) else providers.exporter.count

    for _ in range(rounds):
        for workload, (blocks, max_tokens) in WORKLOADS.items():
            max_tokens = min(max_tokens, 4) if quick else max_tokens
            for name, setting in variants.items():
                key = (workload, name)
                before = spans_so_far(name)
                tracker = None if setting is None else tracker_for(name, setting)
                run = one_run(tracker, requests, max_tokens, blocks)
                wall.setdefault(key, []).append(run.steps / run.seconds)
                cpu.setdefault(key, []).append(run.steps / run.cpu_seconds)
                spans[key] = spans_so_far(name) - before  # also: the export process is done with them
                preemptions[workload] = run.preemptions
                if setting is not None:
                    timed = TimedHooks(tracker_for(name, setting))
                    run = one_run(timed, requests, max_tokens, blocks)
                    spans_so_far(name)  # the next run starts with nothing left to export
                    share.setdefault(key, []).append(timed.seconds / run.seconds)
                    hooks = by_hook.setdefault(key, {hook: [] for hook in HOOKS})
                    for hook, seconds in timed.by_hook.items():
                        hooks[hook].append(seconds / run.seconds)
                    if WORKLOADS[workload][1] == 24:  # the figure compared with section 1's tight loop
                        per_token.append(timed.by_hook["tokens"] / timed.request_tokens * 1e9)
            null = TimedHooks(NullHooks())
            run = one_run(null, requests, max_tokens, blocks)
            wrapper.setdefault(workload, []).append(null.seconds / run.seconds)
    providers.shutdown()
    exported.close()
    out = []
    for workload, (_, max_tokens) in WORKLOADS.items():
        max_tokens = min(max_tokens, 4) if quick else max_tokens
        without = wall[(workload, "without the tracker")]
        without_cpu = statistics.median(cpu[(workload, "without the tracker")])
        for name in variants:
            if variants[name] is None:
                continue
            key = (workload, name)
            ours = statistics.median(wall[key])
            note = (
                f"{requests} requests x {max_tokens} tokens, batch up to 64, {preemptions[workload]} "
                f"preemptions and {spans[key]} spans per run, {rounds} runs each, interleaved"
            )
            what = f"{name}, {workload}"
            out += [
                Measure(
                    "sampling",
                    f"engine steps per second, {what}",
                    "steps/s",
                    ours,
                    {"without the tracker": statistics.median(without)},
                    spread=(min(wall[key]), max(wall[key])),
                    note=note,
                ),
                Measure(
                    "sampling",
                    f"engine steps per second lost, {what}",
                    "fraction",
                    1 - ours / statistics.median(without),
                ),
                Measure(
                    "sampling",
                    f"engine steps per CPU second of the engine thread lost, {what}",
                    "fraction",
                    1 - statistics.median(cpu[key]) / without_cpu,
                ),
                _median(
                    f"share of the engine's run time spent in the tracker's hooks, {what}",
                    "fraction",
                    share[key],
                    _split(by_hook[key]),
                ),
            ]
        out.append(
            _median(
                f"{TIMING_COST}, {workload}",
                "fraction",
                wrapper[workload],
                "no-op hooks timed the same way: counted in the shares above",
            )
        )
    out.append(
        _median(
            "tokens() per request-token inside the engine's loop, 24-token requests (section 1 times it in "
            "a tight loop)",
            "ns",
            per_token,
            "mean over every call, steady batches included (they cost one step whatever their size); "
            "between steps the model's work evicts the tracker's data from the CPU caches, which a tight "
            "loop keeps warm",
        )
    )
    return out


def _median(what: str, unit: str, values: list[float], note: str) -> Measure:
    """The median over the runs, with their spread."""
    return Measure(
        "sampling", what, unit, statistics.median(values), spread=(min(values), max(values)), note=note
    )


def _finish_costs(quick: bool, rounds: int) -> list[Measure]:
    batch, tokens = (4, 16) if quick else (64, 128)
    providers, bare_p = discarding_providers(), discarding_providers()
    trackers = {
        "off": RequestTracker(
            tracer_provider=providers.tracer_provider,
            meter_provider=providers.meter_provider,
            tail_sampling=False,
        ),
        "on, kept": RequestTracker(
            tracer_provider=providers.tracer_provider,
            meter_provider=providers.meter_provider,
            tail_sampling=TailSampling(ratio=1.0),
        ),
        "on, dropped": RequestTracker(
            tracer_provider=providers.tracer_provider,
            meter_provider=providers.meter_provider,
            tail_sampling=TailSampling(ratio=0.0),
        ),
    }
    bare = BareSdkSpans(bare_p.tracer_provider, tokens, False, 100.0)

    def finishing(tracker: RequestTracker) -> Any:
        def run() -> tuple[int, int]:
            ids = [f"req-{next(_tags)}-{i}" for i in range(batch)]
            end = drive(tracker, ids, tokens, False, 100.0, finish=False)
            start = perf_ns()
            for rid in ids:
                tracker.finished(rid, ts=end)
            return perf_ns() - start, batch

        return run

    def bare_sdk() -> tuple[int, int]:
        start = perf_ns()
        for i in range(batch):
            bare.finished(i)
        return perf_ns() - start, batch

    # What a kept request adds to today's finish is the decision itself: timed where it runs, since the
    # medians of two whole finishes differ by more than that from run to run.
    sampler = trackers["on, kept"]._consumer._tail
    decided = [0, 0]  # calls, ns
    keep = sampler.keep  # type: ignore[union-attr]

    def timed_keep(*args: Any) -> bool:
        start = perf_ns()
        try:
            return keep(*args)
        finally:
            decided[0] += 1
            decided[1] += perf_ns() - start

    sampler.keep = timed_keep  # type: ignore[union-attr]
    t = compare(
        {**{name: finishing(tr) for name, tr in trackers.items()}, "bare SDK spans": bare_sdk}, rounds
    )
    providers.shutdown()
    bare_p.shutdown()
    decision = Measure(
        "sampling",
        "tail-sampling decision of a kept request (all a kept request adds to finished())",
        "ns",
        decided[1] / decided[0],
        {"finished(), tail sampling off": t["off"].median_ns},
        note="timed inside finished(), mean over every call",
    )
    return [decision] + [
        Measure(
            "sampling",
            f"finished(), {tokens} output tokens, tail sampling {name}",
            "ns",
            t[name].median_ns,
            {"tail sampling off": t["off"].median_ns, "bare SDK spans": t["bare SDK spans"].median_ns}
            if name != "off"
            else {"bare SDK spans": t["bare SDK spans"].median_ns},
            spread=(t[name].low_ns, t[name].high_ns),
        )
        for name in trackers
    ]


def _volume(quick: bool) -> list[Measure]:
    from opentelemetry.sdk.metrics import MeterProvider  # no reader: the metrics are not the point here

    # Quick mode still runs 64 requests, so the KV cache overflows and tail sampling has preempted ones
    # to keep (every setting exports spans).
    requests, max_tokens = (64, 8) if quick else (96, 24)
    out = []
    for detail in DETAILS:
        for name, setting in SETTINGS.items():
            exporter = OtlpSizeExporter()
            tracer_provider = TracerProvider(shutdown_on_exit=False)
            tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
            meter_provider = MeterProvider(shutdown_on_exit=False)
            tracker = RequestTracker(
                tracer_provider=tracer_provider,
                meter_provider=meter_provider,
                model="tiny",
                tail_sampling=setting,
                trace_detail=detail,
            )
            started = time.perf_counter()
            one_run(tracker, requests, max_tokens)
            seconds = time.perf_counter() - started
            tracer_provider.shutdown()
            meter_provider.shutdown()
            what = f"detail {detail}, {name}"
            per_request = (
                f"{exporter.spans / requests:.1f} spans, {exporter.bytes / requests:,.0f} B per request"
            )
            out.append(
                Measure("sampling", f"spans exported per second, {what}", "spans/s", exporter.spans / seconds)
            )
            out.append(
                Measure(
                    "sampling",
                    f"OTLP bytes per second, {what}",
                    "B/s",
                    exporter.bytes / seconds,
                    note=per_request,
                )
            )
    return out


def run(quick: bool, rounds: int) -> list[Measure]:
    try:
        import torch
    except ImportError:
        return [Measure("sampling", "skipped: torch is not installed", "steps/s", float("nan"))]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _engine_rates(quick, rounds) + _finish_costs(quick, rounds) + _volume(quick)
    finally:
        torch.set_num_threads(threads)
