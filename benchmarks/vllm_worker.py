"""One variant's vLLM frontend: an offline ``LLM`` that runs the workload's batch whenever asked.

Runs in the engine virtualenv, started by ``vllm_fleet`` as
``python -c "from benchmarks.vllm_worker import main; main()" SPEC REPLY_FD`` with the repository as
its working directory (so this checkout's otel_llm is imported, here and in vLLM's engine-core child
process, which vLLM starts as it does by default). ``SPEC`` is JSON: the variant's name, the workload's
fields and the receiver's endpoint. The variant's environment (``vllm_setups.Variant.environment``)
comes from the parent.

Commands arrive as lines on stdin; each answer is one JSON line on file descriptor ``REPLY_FD`` (vLLM
writes its logs to stdout and stderr, which the parent sends to a log file):

- ``round``: one timed ``generate()`` of the batch, spans flushed inside the window; answers output
  tokens, wall nanoseconds (``time.perf_counter_ns``), CPU nanoseconds of this process's main thread
  (which runs ``generate()`` and vLLM's output loop), of the whole process, of the engine-core
  process(es) (every descendant of this process but otel-llm's export processes) and of the export
  processes (export mode ``process``: where the spans are built and exported);
- ``profile``: the same, with otel-llm's entry points counted (``vllm_profile``) and every thread's CPU
  by name, plus the CPU of the span flush and of one metric export (phases variant only);
- ``quit``: shut down.

The first answer, after a warm-up ``generate()``, says ``ready`` with the descendants' pids.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import cpu_clocks
from benchmarks.vllm_setups import BY_NAME, Variant, Workload


class Frontend:
    """The ``LLM`` of one variant and what it needs to run and flush a round."""

    def __init__(self, variant: Variant, workload: Workload, endpoint: str, model: str) -> None:
        self.variant, self.workload = variant, workload
        self.telemetry: Any = None
        if variant.otel_llm:
            # docs/vllm.md's "In code" set-up: providers from the OTEL_* variables, then the instrumentor,
            # before the LLM is built.
            import otel_llm
            from otel_llm.integrations.vllm import VLLMInstrumentor

            self.telemetry = otel_llm.configure()
            VLLMInstrumentor().instrument()
        from vllm import LLM, SamplingParams

        kwargs = workload.llm_kwargs()
        kwargs["disable_log_stats"] = not variant.log_stats
        if variant.vllm_tracing:
            kwargs["otlp_traces_endpoint"] = endpoint
        self.llm = LLM(model=model, served_model_name="tiny-llama", **kwargs)
        self.texts = workload.texts()
        self.params = SamplingParams(max_tokens=workload.max_tokens, ignore_eos=True)
        self.flush = self._flusher()

    def _flusher(self) -> Callable[[], None]:
        """Force-flush of the tracer provider that holds this variant's spans (a no-op without one)."""
        if self.telemetry is not None and self.telemetry.channel is not None:
            # Export mode "process": the records go to the export process, which builds and exports the
            # spans (and, on a flush, the metrics too); the flush returns when it has. This process's
            # own tracer provider still holds any span of vLLM's (its start-up spans): flushed too.
            telemetry = self.telemetry

            def flush() -> None:
                telemetry.tracer_provider.force_flush()
                telemetry.channel.flush(60.0)

            return flush
        if self.telemetry is not None:
            return lambda: self.telemetry.tracer_provider.force_flush()  # spans only: not the metrics
        if self.variant.vllm_tracing:
            from opentelemetry import trace

            # vLLM's init_tracer() installs its TracerProvider (BatchSpanProcessor, OTLP) as the global one.
            provider = trace.get_tracer_provider()
            return lambda: provider.force_flush()  # type: ignore[attr-defined]
        return lambda: None

    def generate(self) -> int:
        """One ``generate()`` of the batch; output tokens."""
        outputs = self.llm.generate(self.texts, self.params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs)


def _engine_ns(pids: list[int]) -> int:
    return sum(cpu_clocks.other_process_ns(p) for p in pids)


def _is_export_process(pid: int) -> bool:
    """Whether ``pid`` is one of otel-llm's export processes (``python -m otel_llm.export.process``)."""
    try:
        return b"otel_llm.export.process" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def split_descendants(pid: int) -> tuple[list[int], list[int]]:
    """This process's descendants as (vLLM's engine core and what it started, otel-llm's export
    processes): the export processes' CPU is reported beside the engine's, not in it."""
    found = cpu_clocks.descendants(pid)
    export = [p for p in found if _is_export_process(p)]
    return [p for p in found if p not in export], export


def timed_round(frontend: Frontend, engine_pids: list[int], export_pids: list[int]) -> dict[str, int]:
    """One window: ``generate()`` then the span flush; CPU and wall clock read at both ends."""
    wall, main, process, engine, export = (
        time.perf_counter_ns(),
        cpu_clocks.thread_ns(),
        cpu_clocks.process_ns(),
        _engine_ns(engine_pids),
        _engine_ns(export_pids),
    )
    tokens = frontend.generate()
    flush_start = time.perf_counter_ns()
    frontend.flush()
    end = time.perf_counter_ns()
    return {
        "tokens": tokens,
        "wall_ns": end - wall,
        "flush_wall_ns": end - flush_start,
        "main_ns": cpu_clocks.thread_ns() - main,
        "process_ns": cpu_clocks.process_ns() - process,
        "engine_ns": _engine_ns(engine_pids) - engine,
        "export_ns": _engine_ns(export_pids) - export,
    }


def profile_round(frontend: Frontend, engine_pids: list[int], counters: Any) -> dict[str, Any]:
    """A round with the entry points counted and every thread's CPU by name; also the CPU, on the main
    thread, of the span flush and of one metric collection and export."""
    entry_points = counters.install()
    counters.reset()
    threads = cpu_clocks.threads_ns()
    main, process = cpu_clocks.thread_ns(), cpu_clocks.process_ns()
    tokens = frontend.generate()
    flush_start = cpu_clocks.thread_ns()
    frontend.flush()
    flush_ns = cpu_clocks.thread_ns() - flush_start
    main_ns, process_ns = cpu_clocks.thread_ns() - main, cpu_clocks.process_ns() - process
    spent = cpu_clocks.thread_deltas(threads, cpu_clocks.threads_ns())
    spent.pop(threading.main_thread().name, None)  # the main thread is reported from its own clock
    metric_start = cpu_clocks.thread_ns()
    if frontend.telemetry is not None:
        frontend.telemetry.meter_provider.force_flush()  # one collection and export, on this thread
    metric_ns = cpu_clocks.thread_ns() - metric_start
    return {
        "tokens": tokens,
        "main_ns": main_ns,
        "process_ns": process_ns,
        "flush_ns": flush_ns,
        "metric_export_ns": metric_ns,
        "export_mode": None if frontend.telemetry is None else frontend.telemetry.export_mode,
        "entry_points": entry_points,
        "cpu_ns": dict(counters.cpu_ns),
        "calls": dict(counters.calls),
        "threads_ns": spent,
    }


def main() -> None:
    spec = json.loads(sys.argv[1])
    reply = os.fdopen(int(sys.argv[2]), "w", buffering=1)
    variant = BY_NAME[spec["variant"]]
    workload = Workload(**spec["workload"])
    model = str(Path(spec["model"]))
    frontend = Frontend(variant, workload, spec["endpoint"], model)
    frontend.generate()  # warm-up: first-use costs stay out of the rounds
    frontend.flush()
    # vLLM's engine core and whatever it started: their CPU is the engine's side of each round; the
    # export processes (export mode "process", in the frontend and in the engine core) are counted apart.
    engine_pids, export_pids = split_descendants(os.getpid())
    reply.write(json.dumps({"ready": True, "engine_pids": engine_pids + export_pids}) + "\n")
    counters = None
    for line in sys.stdin:
        command = line.strip()
        if command == "round":
            reply.write(json.dumps(timed_round(frontend, engine_pids, export_pids)) + "\n")
        elif command == "profile":
            if counters is None:
                from benchmarks.vllm_profile import EntryPointCounters

                counters = EntryPointCounters()
            reply.write(json.dumps(profile_round(frontend, engine_pids, counters)) + "\n")
        else:
            break
    if frontend.telemetry is not None:
        frontend.telemetry.shutdown()
    reply.close()
