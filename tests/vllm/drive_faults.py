"""Drive vLLM's real Scheduler and OutputProcessor with one of vLLM's internals removed or renamed first.

Runs in the vLLM virtualenv (see make_env.sh), launched by test_vllm_faults.py:
``python drive_faults.py OUT.json``. Each case changes one target the integration depends on, the way a
vLLM release could (an output field, an enum member, an argument, a patched method, the API server's
module), then calls ``instrument()``, drives the four requests of drive_scheduler.py's ``mixed``
scenario through vLLM's own scheduler and output processor, and writes down what came out: our
``llm.request`` spans (id and finish reason), the integration's warnings, its error counts
(``otel_llm.integration.errors``, read from a real SDK meter provider) and whether every patched
attribute was the original object again after ``uninstrument()``. The change is undone after each case.

The case ``none`` changes nothing. The API server's module case uses stand-ins for `vllm serve`'s CLI and
API-server modules (this virtualenv has no uvicorn to import vLLM's own), placed where vLLM's are, with
the API server's module under another name.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import sys
import tempfile
import textwrap
from typing import Any

import drive_scheduler as ds
from driver_scenarios import SCENARIOS
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from vllm.v1 import engine as engine_module
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.llm_engine import LLMEngine
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.metrics.stats import IterationStats
from vllm.v1.request import Request, RequestStatus

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.integrations import faults, patching
from otel_llm.integrations.vllm import VLLMInstrumentor

MIXED = next(s for s in SCENARIOS if s.name == "mixed")
PATCHED = {OutputProcessor: (), Scheduler: (), LLMEngine: (), AsyncLLM: ()}


class Undo:
    """The changes a case made to vLLM, undone in reverse order."""

    def __init__(self) -> None:
        self._steps: list[tuple[Any, str, bool, Any]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        self._steps.append((owner, name, name in vars(owner), vars(owner).get(name)))
        setattr(owner, name, value)

    def delete(self, owner: Any, name: str) -> None:
        self._steps.append((owner, name, True, vars(owner)[name]))
        delattr(owner, name)

    def undo(self) -> None:
        for owner, name, had, value in reversed(self._steps):
            if had:
                setattr(owner, name, value)
            elif name in vars(owner):
                delattr(owner, name)


class WithoutEvents:
    """An EngineCoreOutput as a vLLM that renamed ``events`` to ``request_events`` would send it."""

    __slots__ = ("_out",)

    def __init__(self, out: Any) -> None:
        self._out = out

    def __getattr__(self, name: str) -> Any:
        if name == "events":
            raise AttributeError(name)
        return self._out.events if name == "request_events" else getattr(self._out, name)


def output_field_declared(undo: Undo) -> None:
    real = engine_module.EngineCoreOutput
    fields = tuple("request_events" if f == "events" else f for f in real.__struct_fields__)
    undo.set(engine_module, "EngineCoreOutput", type("EngineCoreOutput", (), {"__struct_fields__": fields}))


def enum_member(undo: Undo) -> None:
    undo.set(engine_module, "EngineCoreEventType", enum.IntEnum("EngineCoreEventType", "QUEUED SCHEDULED"))


def argument(undo: Undo) -> None:
    original = Scheduler.__init__

    def __init__(self: Any, *args: Any, stats_enabled: bool = False, **kwargs: Any) -> None:
        kwargs.pop("log_stats", None)  # this vLLM calls it stats_enabled
        original(self, *args, log_stats=stats_enabled, **kwargs)

    undo.set(Scheduler, "__init__", __init__)


def patched_method(undo: Undo) -> None:
    undo.set(OutputProcessor, "process_engine_outputs", OutputProcessor.process_outputs)
    undo.delete(OutputProcessor, "process_outputs")


def stats_method(undo: Undo) -> None:
    undo.delete(OutputProcessor, "update_scheduler_stats")


def serve_module(undo: Undo) -> None:
    import vllm.entrypoints.cli as cli
    import vllm.entrypoints.launchers.api_server as api_server

    root = tempfile.mkdtemp(prefix="vllm-moved-")
    for package, path, text in (
        (api_server, "server.py", "async def build_and_serve(engine_client, listen_address, sock, args):\n"),
        (cli, "serve.py", "from vllm.entrypoints.launchers.api_server.server import build_and_serve\n"),
    ):
        folder = os.path.join(root, package.__name__.replace(".", "_"))
        os.makedirs(folder)
        with open(os.path.join(folder, path), "w") as f:
            f.write(textwrap.dedent(text) + ("    return None\n" if path == "server.py" else ""))
        undo.set(package, "__path__", [folder, *package.__path__])


CASES = {
    "none": None,
    "output_field": None,  # outputs without ``events`` reach the frontend: a failure while tracing
    "output_field_mid_run": None,  # the same from step 6 on, with requests in flight
    "output_field_declared": output_field_declared,
    "enum_member": enum_member,
    "argument": argument,
    "patched_method": patched_method,
    "stats_method": stats_method,
    "serve_module": serve_module,
}


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def originals() -> dict[str, Any]:
    return {f"{cls.__name__}.{name}": value for cls in PATCHED for name, value in vars(cls).items()}


def errors(reader: InMemoryMetricReader) -> dict[str, int]:
    found: dict[str, int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == sc.METRIC_INTEGRATION_ERRORS:
                    for point in metric.data.data_points:
                        found[point.attributes[sc.LLM_INTEGRATION_SITE]] = point.value
    return found


def drive(case: str) -> dict[str, Any]:
    patching._warned.clear()  # each case hears its warnings afresh
    undo = Undo()
    change = CASES[case]
    if change is not None:
        change(undo)
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    tracker = RequestTracker(tracer_provider=tracer_provider, meter_provider=meter_provider, model="tiny")
    heard = Warnings()
    logging.getLogger("otel_llm").addHandler(heard)
    before = originals()
    counted = faults.counts()
    instrumentor = VLLMInstrumentor()
    try:
        instrumentor.instrument(tracker=tracker, meter_provider=meter_provider)
        state = VLLMInstrumentor.state()
        points = state.patch.points if state is not None and state.patch is not None else []
        if case == "serve_module":
            import vllm.entrypoints.cli.serve  # noqa: F401  (what `vllm serve` imports first)
        instrumented_at_start = instrumentor.is_instrumented
        run(case)
        tracker.force_flush()
        instrumented_at_end = instrumentor.is_instrumented
    finally:
        instrumentor.uninstrument()
        logging.getLogger("otel_llm").removeHandler(heard)
        restored = originals() == before
        undo.undo()
    requests = [s for s in spans.get_finished_spans() if s.name == sc.SPAN_REQUEST]
    return {
        "patched": points,
        "instrumented_at_start": instrumented_at_start,
        "instrumented_at_end": instrumented_at_end,
        "restored": restored,
        "warnings": heard.messages,
        "errors": errors(reader),  # as exported: cumulative in this process
        "errors_added": {
            site: n - counted.get((engine, site), 0)
            for (engine, site), n in faults.counts().items()
            if n != counted.get((engine, site), 0)
        },
        "requests": {
            s.attributes[sc.LLM_REQUEST_ID]: s.attributes.get(sc.GEN_AI_RESPONSE_FINISH_REASONS, [None])[0]
            for s in requests
        },
        "vllm_requests": sorted(MIXED.requests),
    }


def run(case: str) -> None:
    """drive_scheduler.py's loop for the ``mixed`` scenario: vLLM's own scheduler and output processor."""
    sched = ds.build_scheduler(MIXED, MODEL_DIR)
    proc = OutputProcessor(tokenizer=None, log_stats=True)
    process = getattr(proc, "process_outputs", None) or proc.process_engine_outputs
    arrivals = {rid: (k, spec.arrive_step) for k, (rid, spec) in enumerate(MIXED.requests.items())}
    step = 0
    while sched.has_unfinished_requests() or arrivals:
        for rid, (index, at) in list(arrivals.items()):
            if at <= step:
                del arrivals[rid]
                ecr = ds.engine_request(MIXED, rid, index)
                proc.add_request(ecr, prompt=None)
                sched.add_request(Request.from_engine_core_request(ecr, block_hasher=None))
        if step == MIXED.abort_at_step:
            proc.abort_requests([MIXED.aborted], internal=True)
            sched.finish_requests([MIXED.aborted], RequestStatus.FINISHED_ABORTED)
        sched_out = sched.schedule()
        model_out = ds.sample(MIXED, sched, sched_out)
        for engine_outputs in sched.update_from_output(sched_out, model_out).values():
            outputs = engine_outputs.outputs
            stats = IterationStats()
            if case == "output_field" or (case == "output_field_mid_run" and step >= 6):
                outputs, stats = [WithoutEvents(out) for out in outputs], None
            process(outputs, engine_outputs.timestamp, stats)
            if hasattr(proc, "update_scheduler_stats"):
                proc.update_scheduler_stats(engine_outputs.scheduler_stats)
        step += 1
        if step > 500:
            raise RuntimeError("the scheduler did not drain")


if __name__ == "__main__":
    MODEL_DIR = ds.tiny_llama_dir()
    results = {case: drive(case) for case in CASES}
    with open(sys.argv[1], "w") as f:
        json.dump(results, f, indent=1)
