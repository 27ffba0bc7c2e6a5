"""Drive vLLM V1's real Scheduler and OutputProcessor on CPU with otel_llm's instrumentor applied.

Runs in the separate vLLM virtualenv (see make_env.sh), launched by test_vllm_integration.py:
``python drive_scheduler.py OUT.json``. No GPU, no weights, no network: the model is a ``config.json``
of a tiny Llama, the "model runner" is this loop, which samples one made-up token per request once its
prompt is computed. The KV cache is 6 blocks of 16 tokens, too small for the requests, so vLLM's own
scheduler preempts and recomputes them. Every batch of engine-core outputs goes through vLLM's own
``OutputProcessor.process_outputs`` (instrumented by otel_llm) with vLLM's ``IterationStats``, so vLLM's
``FinishedRequestStats`` and our spans and metrics come from the same run.

Writes one JSON document: our finished spans, our metric points, vLLM's finished-request stats, vLLM's
preemption events per request, and the tracker's anomaly counts.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ.setdefault("VLLM_CACHE_ROOT", tempfile.mkdtemp(prefix="vllm-cache-"))

import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreEventType, EngineCoreRequest
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.metrics.stats import IterationStats
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from otel_llm import RequestTracker
from otel_llm.export.preaggregated import PreAggregatedMetricExporter
from otel_llm.integrations.vllm import VLLMInstrumentor

BLOCK_SIZE, NUM_BLOCKS = 16, 6  # 96 KV slots for requests that need more: forces preemption
PROMPT_LEN = 30
STOP_TOKEN, OTHER_TOKEN = 99, 42
# request id -> (max_tokens, output index at which the fake model emits the stop token, or None)
REQUESTS = {"r0": (5, None), "r1": (20, None), "r2": (20, 7), "r3": (20, None)}
ABORTED = "r3"  # the client goes away while it waits: finish reason abort
ABORT_AT_STEP = 2
# A W3C parent for r1, as an HTTP frontend would pass it in the request's trace headers.
PARENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_TRACEPARENT = f"00-{PARENT_TRACE_ID}-00f067aa0ba902b7-01"


class ListMetricExporter(MetricExporter):
    """Keeps exported batches in memory; behind PreAggregatedMetricExporter, as in production."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list = []

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        pass


def tiny_llama_dir() -> str:
    path = tempfile.mkdtemp(prefix="tiny-llama-")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 1,
        "vocab_size": 256,
        "max_position_embeddings": 512,
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def build_scheduler() -> Scheduler:
    cfg = VllmConfig(
        model_config=ModelConfig(
            model=tiny_llama_dir(), skip_tokenizer_init=True, dtype="float32", max_model_len=512
        ),
        device_config=DeviceConfig(device="cpu"),  # the CUDA wheel cannot infer a device here
        scheduler_config=SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512, is_encoder_decoder=False
        ),
        cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False),
    )
    cfg.cache_config.num_gpu_blocks = NUM_BLOCKS
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)]
    )
    # log_stats=False on purpose: the instrumentor must turn it on, or no request events exist.
    return Scheduler(
        vllm_config=cfg,
        kv_cache_config=kv,
        block_size=BLOCK_SIZE,
        log_stats=False,
        structured_output_manager=StructuredOutputManager(cfg),
    )


def engine_request(request_id: str, index: int, max_tokens: int) -> EngineCoreRequest:
    return EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=[index + 3] * PROMPT_LEN,
        mm_features=None,
        sampling_params=SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP_TOKEN], detokenize=False),
        pooling_params=None,
        arrival_time=time.time(),
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
        external_req_id=request_id,
        trace_headers={"traceparent": PARENT_TRACEPARENT} if request_id == "r1" else None,
    )


def sample(sched: Scheduler, sched_out) -> ModelRunnerOutput:
    """The made-up model step: one token for each request whose prompt is fully computed."""
    ids = list(sched_out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = sched.requests[rid]
        if req.num_computed_tokens + sched_out.num_scheduled_tokens[rid] < req.num_tokens:
            sampled.append([])  # still in a chunked prefill
            continue
        stop_at = REQUESTS[rid][1]
        sampled.append([STOP_TOKEN] if req.num_output_tokens == stop_at else [OTHER_TOKEN])
    return ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)}, sampled_token_ids=sampled
    )


def run() -> dict:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    metric_exporter = ListMetricExporter()
    reader = PeriodicExportingMetricReader(
        PreAggregatedMetricExporter(metric_exporter), export_interval_millis=3_600_000
    )
    meter_provider = MeterProvider(metric_readers=[reader])
    tracker = RequestTracker(
        tracer_provider=tracer_provider, meter_provider=meter_provider, model="tiny-llama"
    )

    originals = class_functions()
    instrumentor = VLLMInstrumentor()
    instrumentor.instrument(tracker=tracker)
    patched = class_functions()
    sched = build_scheduler()
    proc = OutputProcessor(tokenizer=None, log_stats=True)  # vLLM's own frontend-side stats

    for index, (rid, (max_tokens, _)) in enumerate(REQUESTS.items()):
        ecr = engine_request(rid, index, max_tokens)
        proc.add_request(ecr, prompt=None)
        sched.add_request(Request.from_engine_core_request(ecr, block_hasher=None))

    finished, itls, preempt_events, step = [], [], {rid: 0 for rid in REQUESTS}, 0
    while sched.has_unfinished_requests():
        if step == ABORT_AT_STEP:
            proc.abort_requests([ABORTED], internal=True)  # the frontend's side of a client abort
            sched.finish_requests([ABORTED], _aborted_status())
        sched_out = sched.schedule()
        for engine_outputs in sched.update_from_output(sched_out, sample(sched, sched_out)).values():
            for out in engine_outputs.outputs:
                for event in out.events or []:
                    if event.type == EngineCoreEventType.PREEMPTED:
                        preempt_events[out.request_id] += 1
            stats = IterationStats()
            proc.process_outputs(engine_outputs.outputs, engine_outputs.timestamp, stats)
            finished += stats.finished_requests
            itls += stats.inter_token_latencies_iter
        step += 1
        if step > 500:
            raise RuntimeError("the scheduler did not drain")
    tracker.force_flush()
    reader.force_flush()
    instrumentor.uninstrument()
    restored = class_functions()
    return {
        "patched": sorted(k for k in originals if patched[k] is not originals[k]),
        "restored": all(restored[k] is originals[k] for k in originals),
        "scheduler_log_stats": sched.log_stats,
        "steps": step,
        "parent_trace_id": PARENT_TRACE_ID,
        "aborted": ABORTED,
        "requests": {rid: {"max_tokens": m, "stop_at": s} for rid, (m, s) in REQUESTS.items()},
        "spans": [span_record(s) for s in spans.get_finished_spans()],
        "metrics": metric_records(metric_exporter.batches[-1]),
        "vllm": [vllm_record(f) for f in finished],
        "vllm_preempted_events": preempt_events,
        "vllm_inter_token_latencies": itls,
        "anomalies": tracker.anomaly_counts,
    }


def class_functions() -> dict:
    """The functions the instrumentor wraps, as found in the classes' own namespaces."""
    names = {OutputProcessor: ("add_request", "process_outputs", "abort_requests"), Scheduler: ("__init__",)}
    return {f"{cls.__name__}.{n}": vars(cls).get(n) for cls, ns in names.items() for n in ns}


def _aborted_status():
    from vllm.v1.request import RequestStatus

    return RequestStatus.FINISHED_ABORTED


def span_record(span) -> dict:
    parent = span.parent
    return {
        "name": span.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_id": None if parent is None else f"{parent.span_id:016x}",
        "start": span.start_time,
        "end": span.end_time,
        "status": span.status.status_code.name,
        "attributes": {k: _plain(v) for k, v in (span.attributes or {}).items()},
        "events": [
            {"name": e.name, "ts": e.timestamp, "attributes": {k: _plain(v) for k, v in e.attributes.items()}}
            for e in span.events
        ],
    }


def metric_records(data) -> list[dict]:
    """Every data point of the latest cumulative export, with its sum/count or value."""
    records = []
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    record = {
                        "name": metric.name,
                        "attributes": {k: _plain(v) for k, v in point.attributes.items()},
                    }
                    if hasattr(point, "bucket_counts"):
                        record.update(sum=point.sum, count=point.count)
                    else:
                        record.update(value=point.value)
                    records.append(record)
    return records


def vllm_record(stats) -> dict:
    return {
        "request_id": stats.request_id,
        "finish_reason": stats.finish_reason.name,
        "queued_time": stats.queued_time,
        "prefill_time": stats.prefill_time,
        "decode_time": stats.decode_time,
        "inference_time": stats.inference_time,
        "num_preemptions": stats.num_preemptions,
        "num_generation_tokens": stats.num_generation_tokens,
        "num_prompt_tokens": stats.num_prompt_tokens,
    }


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


if __name__ == "__main__":
    result = run()
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)
