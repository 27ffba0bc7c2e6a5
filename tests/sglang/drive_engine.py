"""Run the real SGLang engine offline (``sglang.Engine``) with otel_llm, and report both sides as JSON.

Runs in the SGLang virtualenv (``tests/sglang/make_env.sh``), started by ``test_sglang_engine.py``:
``python drive_engine.py OUT.json``. otel_llm is switched on the way a user gets it: installed, SGLang
loads its ``sglang.srt.plugins`` entry point in the scheduler process, which exports over OTLP/HTTP to a
real receiver (tests/otlp_receivers.py) running in this process. Per scenario the JSON holds SGLang's own
``meta_info`` per request, the spans and metric points the receiver decoded, and whether SGLang ran its
overlap scheduler.

Scenarios (a fresh engine each: SGLang reads SGLANG_TEST_RETRACT when its scheduler process starts):
- ``forced``: SGLANG_TEST_RETRACT=1, every 10th decode step retracts requests (deterministic);
- ``natural``: 24 prompts x 160 tokens in a 512-token KV pool, without ignore_eos, so SGLang admits
  more than fits and retracts when decoding runs out of room (4-8 per run, timing-dependent);
- ``traced``: SGLang's own ``enable_trace`` on too, exporting to a second (gRPC) receiver;
- ``early_eos``: the tiny model that ends some prompts on EOS after a few tokens while the others run on,
  under SGLang's overlap scheduler (its default), where a request that stops early is streamed as
  finished twice.

SGLang's own figures of what each admission computed: the driver wraps ``Scheduler.get_new_batch_prefill``
in SGLang's scheduler process (which ``spawn`` starts by importing this file as ``__mp_main__``; the
environment variable ``PREFILLS`` names the file) and writes, per request of each new prefill batch, the
batch's ``prefix_lens`` / ``extend_lens`` entries and the request's context length and retraction count,
as SGLang's scheduler holds them, under ``prefills`` in the JSON. Likewise, per batch ``run_batch``
launches, the tokens it computes per request as SGLang's batch holds them before the forward
(``extend_lens`` of a prefill or mixed batch, one each in a decode batch), under ``batches``; and every
``RequestTracker.batch()`` call otel_llm made there (a test-only probe of what the adapter reported),
under ``batch_calls``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # tests/ for otlp_receivers, this folder for tiny_model
from process_tree import export_processes_below  # noqa: E402  (tests/ is on the path from here)

SCENARIOS: dict[str, dict[str, Any]] = {
    "forced": {
        "env": {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "10"},
        "prompts": 8,
        "max_new_tokens": 48,
    },
    # The other export mode (the default is "process"): the spans built in SGLang's scheduler process.
    "forced_in_process": {
        "env": {
            "SGLANG_TEST_RETRACT": "1",
            "SGLANG_TEST_RETRACT_INTERVAL": "10",
            "OTEL_LLM_EXPORT_MODE": "in_process",
        },
        "prompts": 8,
        "max_new_tokens": 48,
    },
    "natural": {
        "env": {"SGLANG_TEST_RETRACT": "0", "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS": "5"},
        "prompts": 24,
        "max_new_tokens": 160,
    },
    # SGLang's own tracing on as well (--enable-trace): it exports over gRPC to a second receiver.
    "traced": {
        "env": {"SGLANG_TEST_RETRACT": "0", "SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS": "200"},
        "prompts": 4,
        "max_new_tokens": 16,
        "enable_trace": True,
    },
    "early_eos": {
        "env": {"SGLANG_TEST_RETRACT": "0"},
        "prompts": 12,
        "max_new_tokens": 32,
        "model": "stops_early",
    },
}
ENGINE_ARGS = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "dtype": "float32",
    "disable_cuda_graph": True,
    "skip_server_warmup": True,
    "max_total_tokens": 512,
    "context_length": 512,
    "enable_metrics": True,  # SGLang sends its per-request time stats to meta_info only with metrics on
    "log_level": "error",
}
PROMPTS = [
    "Hello world, tell me a story about tokens",
    "The quick brown fox jumps over the lazy dog",
    "Large language model servers queue requests",
    "When the key value cache is full a request is retracted",
]


PREFILLS = "OTEL_LLM_TEST_SGLANG_PREFILLS"


def record_prefills(path: str) -> None:
    """In SGLang's scheduler process: append SGLang's own figures of every prefill batch it builds."""
    from sglang.srt.managers.scheduler import Scheduler

    original = Scheduler.get_new_batch_prefill

    def get_new_batch_prefill(self: Any, *args: Any, **kwargs: Any) -> Any:
        plan = original(self, *args, **kwargs)
        batch = getattr(plan, "batch_to_run", plan)
        if batch is not None:
            rows = [
                {
                    "rid": req.rid,
                    "stamp": req.time_stats.last_forward_entry_time,
                    "retractions": req.retraction_count,
                    "prompt": len(req.origin_input_ids),
                    "context": len(req.origin_input_ids) + len(req.output_ids),
                    "prefix_len": prefix,
                    "extend_len": extend,
                }
                for req, prefix, extend in zip(batch.reqs, batch.prefix_lens, batch.extend_lens)
            ]
            with open(path, "a") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)
        return plan

    Scheduler.get_new_batch_prefill = get_new_batch_prefill


BATCHES = "OTEL_LLM_TEST_SGLANG_BATCHES"


def record_batches(path: str) -> None:
    """In SGLang's scheduler process: append each batch ``run_batch`` launches (SGLang's side) and each
    ``RequestTracker.batch()`` call (ours), one JSON line each."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

    from otel_llm.hooks.tracker import Tracker

    run_batch, report = Scheduler.run_batch, Tracker.batch
    process, stream = Scheduler.process_batch_result, SchedulerOutputStreamer.stream_output
    launches: list[int] = []  # the launched batches whose results are not processed yet, in order
    processing: list[int] = []  # the batch whose result is being processed, while it is
    count = iter(range(1 << 30))

    def write(row: dict[str, Any]) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def launched(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        mode = batch.forward_mode
        rids = [req.rid for req in batch.reqs]
        tokens = list(batch.extend_lens) if mode.is_extend() else [1] * len(rids) if mode.is_decode() else []
        number = next(count)
        launches.append(number)
        scheduled, at = dict(zip(rids, tokens)), time.monotonic()
        write({"side": "sglang", "mode": mode.name, "scheduled": scheduled, "n": number, "at": at})
        return run_batch(self, batch, *args, **kwargs)

    def processed(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        processing[:] = launches[:1]
        del launches[:1]
        try:
            return process(self, batch, *args, **kwargs)
        finally:
            processing.clear()

    def streamed(self: Any, *args: Any, **kwargs: Any) -> Any:
        if processing:  # the first stream of a batch's result: where its tokens went out
            write({"side": "stream", "n": processing.pop(), "at": time.monotonic()})
        return stream(self, *args, **kwargs)

    def reported(self: Any, scheduled: Any, ts: Any = None, recompute: Any = None) -> None:
        write({"side": "otel_llm", "scheduled": dict(scheduled)})
        report(self, scheduled, ts=ts, recompute=recompute)

    Scheduler.run_batch = launched
    Scheduler.process_batch_result = processed
    SchedulerOutputStreamer.stream_output = streamed
    Tracker.batch = reported


if __name__ == "__mp_main__" and os.environ.get(PREFILLS):  # a process SGLang spawned
    record_prefills(os.environ[PREFILLS])
if __name__ == "__mp_main__" and os.environ.get(BATCHES):
    record_batches(os.environ[BATCHES])


def value(v: Any) -> Any:
    """A protobuf AnyValue as a plain Python value (arrays as lists)."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def span_json(resource: Any, span: Any) -> dict[str, Any]:
    attrs = {a.key: value(a.value) for a in span.attributes}
    return {
        "name": span.name,
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_span_id": span.parent_span_id.hex(),
        "start": span.start_time_unix_nano,
        "end": span.end_time_unix_nano,
        "attributes": attrs,
        "events": [e.name for e in span.events],
        "service": next((a.value.string_value for a in resource.attributes if a.key == "service.name"), None),
    }


def run(name: str, models: dict[str, str], tmp: Path) -> dict[str, Any]:
    import sglang
    from google.protobuf.json_format import MessageToDict
    from otlp_receivers import GrpcReceiver, HttpReceiver

    spec = SCENARIOS[name]
    model = models[spec.get("model", "default")]
    os.environ.update(spec["env"])
    prefills = tmp / f"{name}.prefills.jsonl"
    os.environ[PREFILLS] = str(prefills)
    batches = tmp / f"{name}.batches.jsonl"
    os.environ[BATCHES] = str(batches)
    with HttpReceiver() as receiver, GrpcReceiver() as sglang_receiver:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        extra: dict[str, Any] = {}
        if spec.get("enable_trace"):
            extra = {"enable_trace": True, "otlp_traces_endpoint": sglang_receiver.endpoint.split("//")[-1]}
        engine = sglang.Engine(model_path=model, **ENGINE_ARGS, **extra)
        try:
            prompts = [PROMPTS[i % len(PROMPTS)] + f" #{i}" for i in range(spec["prompts"])]
            params = {"max_new_tokens": spec["max_new_tokens"], "temperature": 0.0}
            started = time.monotonic()
            outputs = engine.generate(prompts, params)
            took = time.monotonic() - started
            overlap = not engine.server_args.disable_overlap_schedule
            rids = {o["meta_info"]["id"] for o in outputs}

            def all_spans(c: Any) -> bool:
                roots = [
                    s
                    for _, s in c.spans() + sglang_receiver.collected.spans()
                    if s.name == "llm.request"
                    and any(a.key == "llm.request.id" and a.value.string_value in rids for a in s.attributes)
                ]
                return len(roots) >= len(rids) and bool(c.metrics("gen_ai.server.request.duration"))

            arrived = receiver.collected.wait_until(all_spans, timeout_s=30)
            export_processes = len(export_processes_below(os.getpid()))
        finally:
            engine.shutdown()
        metrics = [
            {"name": metric.name, "data": MessageToDict(metric, preserving_proto_field_name=True)}
            for _, metric in receiver.collected.metrics()
        ]
        return {
            "overlap": overlap,
            "arrived": arrived,
            "export_processes": export_processes,
            "seconds": took,
            "meta": [o["meta_info"] for o in outputs],
            "spans": [span_json(r, s) for r, s in receiver.collected.spans()],
            "grpc_spans": [span_json(r, s) for r, s in sglang_receiver.collected.spans()],
            "metrics": metrics,
            "prefills": [json.loads(line) for line in prefills.read_text().splitlines()]
            if prefills.exists()
            else [],
            **batch_rows(batches),
        }


def batch_rows(path: Path) -> dict[str, list[dict[str, Any]]]:
    """SGLang's launched batches and otel_llm's batch() calls, each in order, from ``record_batches``."""
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    ends = {r["n"]: r["at"] for r in rows if r["side"] == "stream"}
    batches = [r for r in rows if r["side"] == "sglang"]
    for b in batches:
        b["streamed_at"] = ends.get(b.get("n"))
    return {
        "batches": batches,
        "batch_calls": [r["scheduled"] for r in rows if r["side"] == "otel_llm"],
    }


def main() -> None:
    out = Path(sys.argv[1])
    names = sys.argv[2:] or list(SCENARIOS)
    import tiny_model

    os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "200")
    os.environ.setdefault("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    os.environ.setdefault("OTEL_METRIC_EXPORT_INTERVAL", "600000")  # metrics leave on the idle flush
    with tempfile.TemporaryDirectory() as tmp:
        models = {"default": str(tiny_model.make(Path(tmp) / "model"))}
        if any(SCENARIOS[name].get("model") == "stops_early" for name in names):
            models["stops_early"] = str(tiny_model.make(Path(tmp) / "stops_early", stops_early=True))
        results = {name: run(name, models, Path(tmp)) for name in names}
    out.write_text(json.dumps({"scenarios": results}))


if __name__ == "__main__":
    main()
