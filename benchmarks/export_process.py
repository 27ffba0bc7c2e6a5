"""Section 9: what a finished request costs the engine's process, every thread of it and export included,
with otel_llm's telemetry built in that process or in the export process beside it.

The workload (issue "Off the engine's process"): ``configure()`` exporting OTLP/gRPC to a receiver in a
process of its own, every trace kept, requests of 16 output tokens in a batch of 64, every 4th request
preempted once (after its 4th token, rescheduled the next step), paced at about 800 finished requests
per second (a 5 ms engine step that sleeps what its own work leaves of it, as an engine waits on its
GPU). Each variant runs in a process of its own, rounds interleaved:

- ``bare``: the same loop calling no hook at all (what the engine costs without otel_llm);
- ``in_process``: ``configure(export_mode="in_process")``: spans and metrics built and exported here;
- ``process``: ``configure(export_mode="process")``: records sent to the export process;
- ``process_sdk_encoder``: the same, with the SDK's OTLP encoder (``OTEL_LLM_OTLP_ENCODER=sdk``): what
  otel_llm's own encoder saves the export process, in the same run.

Measured in each, over a window that starts after a warm-up and ends after ``Telemetry.force_flush()``
(so the export work of the window's requests is in it, wherever it runs): the engine process's CPU
(``CLOCK_PROCESS_CPUTIME_ID``: all its threads) and its export process's (its own CPU clock). Reported
per finished request: the engine's CPU over the bare loop's, the export process's, and their sum
against the in-process total.

Run on its own with ``python -m benchmarks.export_process [--quick] [--rounds N]``; the section
``export`` of ``python -m benchmarks`` runs the same.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.cpu_clocks import descendants, other_process_ns, process_ns
from benchmarks.report import Measure

BATCH = 64
TOKENS = 16
STEP_S = 0.005  # 64 slots / 16 steps per request * 200 steps/s = 800 finished requests/s
VARIANTS = ("bare", "in_process", "process", "process_sdk_encoder")
SDK_ENCODER = "process_sdk_encoder"  # ``process`` with the SDK's OTLP encoder (OTEL_LLM_OTLP_ENCODER=sdk)


class NoHooks:
    """The bare loop's stand-in: no call reaches otel_llm."""


def drive(tracker: Any, prefix: str, requests: int, paced: bool = True) -> int:
    """Continuous batching of ``requests``; every 4th is preempted after its 4th token and rescheduled at
    the next step. Returns the steps taken."""
    hooks = tracker is not None
    waiting = [f"{prefix}-{i}" for i in range(requests)]
    waiting.reverse()
    running: dict[str, int] = {}
    resumed: list[str] = []
    steps = 0
    clock = time.monotonic
    next_step = clock()
    while waiting or running or resumed:
        new = resumed
        resumed = []
        for rid in new:
            running[rid] = running.get(rid, 4)
        while waiting and len(running) < BATCH:
            rid = waiting.pop()
            running[rid] = 0
            new.append(rid)
            if hooks:
                tracker.queued(rid, prompt_tokens=128)
        if hooks and new:
            tracker.scheduled(new)
        ids = list(running)
        if hooks:
            tracker.tokens(ids)
        victims = []
        for rid in ids:
            produced = running[rid] = running[rid] + 1
            if produced >= TOKENS:
                del running[rid]
                if hooks:
                    tracker.finished(rid)
            elif produced == 4 and int(rid.rsplit("-", 1)[1]) % 4 == 0:
                victims.append(rid)
        if victims:
            if hooks:
                tracker.preempted(victims)
            for rid in victims:
                del running[rid]
            resumed = victims
        steps += 1
        if paced:
            next_step += STEP_S
            pause = next_step - clock()
            if pause > 0:
                time.sleep(pause)
            else:
                next_step = clock()
    return steps


def worker(variant: str, requests: int, warmup: int) -> dict[str, Any]:
    """One variant in this process (the receiver's endpoint is in the environment)."""
    telemetry = tracker = None
    if variant != "bare":
        import otel_llm

        mode = "process" if variant == SDK_ENCODER else variant
        telemetry = otel_llm.configure(set_global=False, service_name="bench-export", export_mode=mode)
        tracker = otel_llm.RequestTracker(
            tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider, model="bench"
        )
    drive(tracker, "warm", warmup)
    if telemetry is not None:
        telemetry.force_flush(timeout_s=60)
    children = descendants(os.getpid())
    engine0, export0 = process_ns(), sum(other_process_ns(pid) for pid in children)
    wall0 = time.perf_counter()
    steps = drive(tracker, "timed", requests)
    flushed = telemetry.force_flush(timeout_s=60) if telemetry is not None else True
    wall = time.perf_counter() - wall0
    engine = process_ns() - engine0
    export = sum(other_process_ns(pid) for pid in children) - export0
    result = {
        "variant": variant,
        "requests": requests,
        "steps": steps,
        "wall_s": wall,
        "engine_cpu_ns": engine,
        "export_cpu_ns": export,
        "export_processes": len(children),
        "flushed": flushed,
    }
    if telemetry is not None:
        result["lost"] = telemetry.delivery("spans")[1]
        telemetry.shutdown(timeout_s=30)
    return result


def _run_worker(variant: str, requests: int, warmup: int, endpoint: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_METRIC_EXPORT_INTERVAL="600000",
        OTEL_BSP_MAX_QUEUE_SIZE="100000",  # every trace kept: nothing dropped for lack of room
    )
    if variant == SDK_ENCODER:
        env["OTEL_LLM_OTLP_ENCODER"] = "sdk"
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.export_process", "--worker", variant, str(requests), str(warmup)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(quick: bool, rounds: int) -> dict[str, Any]:
    from benchmarks.end_to_end import Receiver

    requests, warmup = (400, 200) if quick else (6000, 1000)
    receiver = Receiver()
    try:
        endpoint = f"http://127.0.0.1:{receiver.port}"
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        for _ in range(rounds):
            for variant in VARIANTS:
                runs[variant].append(_run_worker(variant, requests, warmup, endpoint))
    finally:
        receiver.close()
    return {"requests": requests, "rounds": rounds, "runs": runs}


def per_request(runs: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [r[key] / r["requests"] for r in runs]


def measures(result: dict[str, Any]) -> list[Measure]:
    runs = result["runs"]
    bare = statistics.median(per_request(runs["bare"], "engine_cpu_ns"))
    out: list[Measure] = []
    totals: dict[str, float] = {}
    for variant in ("in_process", "process"):
        engine = [v - bare for v in per_request(runs[variant], "engine_cpu_ns")]
        export = per_request(runs[variant], "export_cpu_ns")
        total = [a + b for a, b in zip(engine, export)]
        totals[variant] = statistics.median(total)
        rate = statistics.median(r["requests"] / r["wall_s"] for r in runs[variant])
        note = f"{result['requests']} requests a round, about {rate:,.0f} finished/s"
        out.append(
            Measure(
                "export",
                f"engine-process CPU per finished request over the bare loop, export mode {variant}",
                "ns",
                statistics.median(engine),
                spread=(min(engine), max(engine)),
                note=note,
            )
        )
        out.append(
            Measure(
                "export",
                f"export-process CPU per finished request, export mode {variant}",
                "ns",
                statistics.median(export),
                spread=(min(export), max(export)),
            )
        )
    sdk_export = per_request(runs.get(SDK_ENCODER, []), "export_cpu_ns")
    if sdk_export:
        ours = per_request(runs["process"], "export_cpu_ns")
        out.append(
            Measure(
                "export",
                "export-process CPU per finished request, export mode process, otel_llm's OTLP encoder vs "
                "the SDK's",
                "ns",
                statistics.median(ours),
                {"the SDK's encoder (OTEL_LLM_OTLP_ENCODER=sdk)": statistics.median(sdk_export)},
                spread=(min(ours), max(ours)),
            )
        )
    out.append(
        Measure(
            "export",
            "total CPU per request (engine + export process), process vs in_process",
            "ns",
            totals["process"],
            {"in_process": totals["in_process"]},
        )
    )
    return out


def run(quick: bool, rounds: int) -> list[Measure]:
    # Rounds of 6,000 requests each (about 8 s a variant): five are enough for a stable median.
    return measures(measure(quick, 1 if quick else max(1, min(rounds, 5))))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.export_process")
    parser.add_argument("--worker", nargs=3, metavar=("VARIANT", "REQUESTS", "WARMUP"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the raw result here")
    args = parser.parse_args(argv)
    if args.worker:
        variant, requests, warmup = args.worker
        print(json.dumps(worker(variant, int(requests), int(warmup))), flush=True)
        return 0
    result = measure(args.quick, 1 if args.quick else args.rounds)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    for m in measures(result):
        spread = f" ({m.spread[0] / 1e3:.1f} - {m.spread[1] / 1e3:.1f} µs)" if m.spread else ""
        peers = "".join(f"; {k}: {v / 1e3:.1f} µs" for k, v in m.peers.items())
        print(f"{m.name}: {m.ours / 1e3:.1f} µs{spread}{peers}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
