"""Drive vLLM V1's real Scheduler and OutputProcessor on CPU with otel_llm's instrumentor applied.

Runs in the separate vLLM virtualenv (see make_env.sh), launched by the tests in this folder:
``python drive_scheduler.py OUT.json``. No GPU, no weights, no network: the model is a ``config.json``
of a tiny Llama, the "model runner" is this loop, which samples one made-up token per request once its
prompt is computed (more when vLLM scheduled draft tokens to verify). KV caches too small for the
requests make vLLM's own scheduler preempt and recompute them. Every batch of engine-core outputs goes
through vLLM's own ``OutputProcessor.process_outputs`` (instrumented by otel_llm) with vLLM's
``IterationStats``, so vLLM's ``FinishedRequestStats`` and our spans and metrics come from the same run.
Then, as vLLM's engine loop does, the step's ``SchedulerStats`` go to ``update_scheduler_stats``; the
driver keeps vLLM's own numbers of each step (``vllm_engine_state``) to compare the engine-state metrics.
At every rescheduling of a preempted request it also writes down, from vLLM's ``Request`` itself, the
tokens vLLM found cached and had left to compute, and then the tokens it scheduled for the recompute
(``vllm_reschedulings``), for the recompute figures.

Each request reaches the scheduler as it reaches vLLM's engine core from a frontend in another process:
packed and encoded by vLLM's own client code, decoded by the engine core's decoder (driver_frontend.py;
on vLLM 0.34 its prompt ids arrive as a NumPy array). The frontend's OutputProcessor gets the request as
made. The driver follows vLLM's releases by feature detection (driver_frontend.py), never by version.

Scenarios are in driver_scenarios.py; each runs with a fresh tracker, scheduler and output processor.

Writes one JSON document, ``{"scenarios": {name: run}}``; each run holds our finished spans, our metric
points, vLLM's finished-request stats, the engine-core timeline of every request (events and token
batches, as vLLM sent them) and the tracker's anomaly counts. Pass ``--print`` to also print the timelines,
``--export-mode=in_process`` to read the spans and metrics from the driver's own providers instead of
through ``configure()``'s export process (the default, ``process``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ.setdefault("VLLM_CACHE_ROOT", tempfile.mkdtemp(prefix="vllm-cache-"))
# tests/, for the export mode "process" harness and its OTLP receiver (after this folder, which is first).
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from driver_frontend import EngineCoreLink, model_runner_output
from driver_records import (
    ListMetricExporter,
    engine_timeline,
    metric_records,
    print_timelines,
    span_record,
    vllm_record,
)
from driver_scenarios import OTHER_TOKEN, SCENARIOS, STOP_TOKEN, Scenario
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.metrics.stats import IterationStats
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager
from vllm.version import __version__ as VLLM_VERSION

from otel_llm import RequestTracker
from otel_llm.export.preaggregated import PreAggregatedMetricExporter
from otel_llm.integrations.vllm import VLLMInstrumentor

BLOCK_SIZE = 16
MAX_MODEL_LEN = 512
# A W3C parent, as an HTTP frontend would pass it in the request's trace headers.
PARENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_TRACEPARENT = f"00-{PARENT_TRACE_ID}-00f067aa0ba902b7-01"


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
        "max_position_embeddings": MAX_MODEL_LEN,
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def build_scheduler(scenario: Scenario, model_dir: str) -> Scheduler:
    model = ModelConfig(
        model=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=MAX_MODEL_LEN
    )
    parallel = ParallelConfig()
    speculative = None
    if scenario.num_speculative_tokens:
        speculative = SpeculativeConfig(
            method="ngram",
            num_speculative_tokens=scenario.num_speculative_tokens,
            prompt_lookup_min=1,
            prompt_lookup_max=3,
            target_model_config=model,
            target_parallel_config=parallel,
        )
    cfg = VllmConfig(
        model_config=model,
        parallel_config=parallel,
        speculative_config=speculative,
        device_config=DeviceConfig(device="cpu"),  # the CUDA wheel cannot infer a device here
        scheduler_config=SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=scenario.max_num_batched_tokens,
            enable_chunked_prefill=True,
            max_model_len=MAX_MODEL_LEN,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=scenario.prefix_caching),
    )
    cfg.cache_config.num_gpu_blocks = scenario.num_blocks
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=scenario.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
    )
    # log_stats=False on purpose: the instrumentor must turn it on, or no request events exist.
    return Scheduler(
        vllm_config=cfg,
        kv_cache_config=kv,
        block_size=BLOCK_SIZE,
        log_stats=False,
        structured_output_manager=StructuredOutputManager(cfg),
    )


def block_hasher(scenario: Scenario, sched: Scheduler):
    """What vLLM's engine core gives each request when prefix caching is on: its block hasher."""
    if not scenario.prefix_caching:
        return None
    hash_fn = get_hash_fn_by_name(sched.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return get_request_block_hasher(BLOCK_SIZE, hash_fn)


def engine_request(scenario: Scenario, request_id: str, index: int) -> EngineCoreRequest:
    spec = scenario.requests[request_id]
    parented = request_id == scenario.parented
    shared = min(scenario.shared_prefix, spec.prompt_len)
    return EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=[2] * shared + [index + 3] * (spec.prompt_len - shared),
        mm_features=None,
        sampling_params=SamplingParams(
            max_tokens=spec.max_tokens, stop_token_ids=[STOP_TOKEN], detokenize=False
        ),
        pooling_params=None,
        arrival_time=time.time(),
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
        external_req_id=request_id,
        trace_headers={"traceparent": PARENT_TRACEPARENT} if parented else None,
    )


def sample(scenario: Scenario, sched: Scheduler, sched_out) -> ModelRunnerOutput:
    """The made-up model step: tokens for each request whose prompt is fully computed.

    One token, plus the request's ``accepted`` share of the drafts vLLM scheduled for verification.
    """
    ids = list(sched_out.num_scheduled_tokens)
    if scenario.seconds_per_token:  # the model's compute, in proportion to the tokens of the step
        time.sleep(scenario.seconds_per_token * sched_out.total_num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = sched.requests[rid]
        # schedule() has already added this step's tokens to num_computed_tokens: the step ends the
        # prompt (or a recompute) when that reaches num_tokens; before, it is a chunk, with no token.
        if req.num_computed_tokens < req.num_tokens:
            sampled.append([])  # still in a chunked prefill
            continue
        spec = scenario.requests[rid]
        drafts = len(sched_out.scheduled_spec_decode_tokens.get(rid, ()))
        first = req.num_output_tokens
        sampled.append(
            [
                STOP_TOKEN if k == spec.stop_at else OTHER_TOKEN
                for k in range(first, first + 1 + min(drafts, spec.accepted))
            ]
        )
    return model_runner_output(ids, sampled)


class InProcess:
    """Export mode ``in_process``: the tracker on the driver's own providers, read from memory."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.metric_exporter = ListMetricExporter()
        self.reader = PeriodicExportingMetricReader(
            PreAggregatedMetricExporter(self.metric_exporter), export_interval_millis=3_600_000
        )
        meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracker = RequestTracker(
            tracer_provider=tracer_provider, meter_provider=meter_provider, model="tiny-llama"
        )

    def read(self) -> tuple[list, object]:
        """The finished spans and one metrics collection, after the tracker's flush."""
        self.tracker.force_flush()
        self.reader.force_flush()
        return list(self.spans.get_finished_spans()), self.metric_exporter.batches[-1]

    def close(self) -> None:
        """Nothing to stop."""


class ThroughExportProcess:
    """Export mode ``process`` (the default): the tracker on ``configure()``'s providers, its records
    built and exported by the export process to a real OTLP/gRPC receiver here, read back from it
    (tests/export_harness.py)."""

    def __init__(self) -> None:
        from export_harness import ExportHarness

        self.harness = ExportHarness(model="tiny-llama")
        self.tracker = self.harness.tracker

    def read(self) -> tuple[list, object]:
        spans = self.harness.finished_spans()
        return spans, self.harness.capture.get_metrics_data()

    def close(self) -> None:
        self.harness.close()


def run(scenario: Scenario, model_dir: str, export_mode: str) -> dict:
    pipeline = ThroughExportProcess() if export_mode == "process" else InProcess()
    tracker = pipeline.tracker

    tokens_calls = log_tokens_calls(tracker)
    originals = class_functions()
    instrumentor = VLLMInstrumentor()
    instrumentor.instrument(tracker=tracker)
    patched = class_functions()
    sched = build_scheduler(scenario, model_dir)
    proc = OutputProcessor(tokenizer=None, log_stats=True)  # vLLM's own frontend-side stats
    hasher = block_hasher(scenario, sched)
    link = EngineCoreLink()  # each request reaches the engine core as a frontend in another process sends it
    engine_core_requests: list[Request] = []

    arrivals = {rid: (index, spec.arrive_step) for index, (rid, spec) in enumerate(scenario.requests.items())}

    def arrive(step: int) -> None:
        for rid, (index, at) in list(arrivals.items()):
            if at <= step:
                del arrivals[rid]
                ecr = engine_request(scenario, rid, index)
                proc.add_request(ecr, prompt=None)
                engine_core_request = Request.from_engine_core_request(link.send(ecr), block_hasher=hasher)
                engine_core_requests.append(engine_core_request)
                sched.add_request(engine_core_request)

    arrive(0)
    finished, itls, timeline, step = [], [], {rid: [] for rid in scenario.requests}, 0
    engine_state = VllmEngineState()
    reschedulings = ReschedulingLog()
    steps: list[dict] = []
    batch_calls = log_batch_calls(tracker)
    while sched.has_unfinished_requests() or arrivals:
        arrive(step)
        if step == scenario.abort_at_step:
            proc.abort_requests([scenario.aborted], internal=True)  # the frontend's side of a client abort
            sched.finish_requests([scenario.aborted], RequestStatus.FINISHED_ABORTED)
        preempted = {rid for rid, req in sched.requests.items() if req.status == RequestStatus.PREEMPTED}
        recomputing = set(reschedulings.recomputing)
        sched_out = sched.schedule()
        reschedulings.step(sched, sched_out, preempted)
        steps.append(step_record(sched, sched_out, preempted | recomputing))
        model_out = sample(scenario, sched, sched_out)
        for engine_outputs in sched.update_from_output(sched_out, model_out).values():
            steps[-1]["outputs_ts"] = engine_outputs.timestamp
            engine_timeline(timeline, step, engine_outputs.outputs, engine_outputs.timestamp)
            stats = IterationStats()
            proc.process_outputs(engine_outputs.outputs, engine_outputs.timestamp, stats)
            proc.update_scheduler_stats(engine_outputs.scheduler_stats)  # as LLMEngine.step does
            engine_state.add(engine_outputs, stats)
            finished += stats.finished_requests
            itls += stats.inter_token_latencies_iter
        if scenario.num_speculative_tokens:
            propose_drafts(scenario, sched, model_out.req_ids)
        step += 1
        if step > 500:
            raise RuntimeError(f"{scenario.name}: the scheduler did not drain")
    spans, metrics_data = pipeline.read()
    pipeline.close()
    instrumentor.uninstrument()
    restored = class_functions()
    return {
        "patched": sorted(k for k in originals if patched[k] is not originals[k]),
        "restored": all(restored[k] is originals[k] for k in originals),
        "scheduler_log_stats": sched.log_stats,
        "steps": step,
        "parent_trace_id": PARENT_TRACE_ID if scenario.parented else None,
        "aborted": scenario.aborted,
        "requests": {rid: vars(spec) for rid, spec in scenario.requests.items()},
        "prefix_caching": scenario.prefix_caching,
        "export_mode": export_mode,
        "spans": [span_record(s) for s in spans],
        "metrics": metric_records(metrics_data),
        "vllm": [vllm_record(f) for f in finished],
        "vllm_timeline": timeline,
        "vllm_preempted_events": {
            rid: sum(1 for kind, *_ in entries if kind == "PREEMPTED") for rid, entries in timeline.items()
        },
        "vllm_inter_token_latencies": itls,
        "vllm_engine_state": vars(engine_state),
        "vllm_reschedulings": reschedulings.by_request,
        "anomalies": tracker.anomaly_counts,
        "tokens_calls": tokens_calls,
        "vllm_steps": steps,
        "batch_calls": batch_calls,
        "batch_log": batch_log(tracker),
        "vllm_version": VLLM_VERSION,
        "engine_core_received": {"packs_prompt": link.packs_prompt, "requests": link.received},
        "engine_core_prompt_types": sorted({type(r.prompt_token_ids).__name__ for r in engine_core_requests}),
    }


def step_record(sched: Scheduler, sched_out, recomputing: set[str]) -> dict:
    """One step as vLLM's scheduler made it: ``num_scheduled_tokens`` and, per request, what vLLM's own
    ``Request`` says those tokens were: ``recompute`` (re-admitted after a preemption, until its
    recompute is done), ``prefill`` (prompt tokens, before its first output), ``decode`` (one token) or
    ``spec`` (one plus draft tokens to verify). schedule() has already added the step's tokens to
    ``num_computed_tokens``; what was computed before the step is that minus them."""
    kinds = {}
    for rid, n in sched_out.num_scheduled_tokens.items():
        req = sched.requests[rid]
        if rid in recomputing:
            kinds[rid] = "recompute"
        elif req.num_computed_tokens - n < req.num_prompt_tokens:
            kinds[rid] = "prefill"
        else:
            kinds[rid] = "spec" if n > 1 else "decode"
    return {"scheduled": dict(sched_out.num_scheduled_tokens), "kinds": kinds, "outputs_ts": None}


def log_batch_calls(tracker: RequestTracker) -> list[dict]:
    """Every ``batch()`` call the adapter makes on ``tracker``: its mapping (copied), timestamp and the
    requests it said recompute."""
    calls: list[dict] = []
    batch = tracker.batch

    def logged(scheduled, ts=None, recompute=None):
        calls.append({"scheduled": dict(scheduled), "ts": ts, "recompute": sorted(recompute or ())})
        batch(scheduled, ts=ts, recompute=recompute)

    tracker.batch = logged
    return calls


def batch_log(tracker: RequestTracker) -> list[dict]:
    """The tracker's step log as it classified each step (read from its private ``_batch_log``: a
    test-only probe, no public figure holds a step's composition): tokens by kind and the heavy entries."""
    log = tracker._batch_log
    if log is None:
        return []
    return [
        {
            "start": s.start,
            "end": s.end,
            "requests": s.requests,
            "prefill": s.prefill,
            "recompute": s.recompute,
            "decode": s.decode,
            "spec": s.spec,
            "heavy": [list(h) for h in s.heavy],
        }
        for s in log.steps
    ]


def log_tokens_calls(tracker: RequestTracker) -> list[dict]:
    """Every ``tokens()`` call the adapter makes on ``tracker``: its ids, whether it passed counts, and
    whether the tracker took its steady path. That path is the one that moves the tracker's previous
    step forward instead of starting a new one, so the step object staying the same is its mark (read
    from the tracker's private ``_prev_step``: no public figure tells the two paths apart)."""
    calls: list[dict] = []
    tokens = tracker.tokens

    def logged(request_ids, ts=None, counts=None):
        before = tracker._prev_step
        tokens(request_ids, ts=ts, counts=counts)
        calls.append(
            {"ids": list(request_ids), "counts": counts is not None, "steady": tracker._prev_step is before}
        )

    tracker.tokens = logged
    return calls


class ReschedulingLog:
    """vLLM's own numbers at each rescheduling of a preempted request, read from its ``Request`` right
    after ``schedule()`` (which has added this step's scheduled tokens to ``num_computed_tokens``): the
    tokens it found cached, those it had left to compute (``num_tokens`` - cached), and then the tokens
    it scheduled for the request until the recompute was done, or until it was preempted again first."""

    def __init__(self) -> None:
        self.by_request: dict[str, list[dict]] = {}
        self._recomputing: dict[str, dict] = {}

    @property
    def recomputing(self) -> set[str]:
        """Requests re-admitted after a preemption whose recompute is not done yet."""
        return set(self._recomputing)

    def step(self, sched: Scheduler, sched_out, preempted_before: set[str]) -> None:
        for rid in list(self._recomputing):
            if sched.requests.get(rid) is None or sched.requests[rid].status == RequestStatus.PREEMPTED:
                self._recomputing.pop(rid)["cut_short"] = True
        for rid, n in sched_out.num_scheduled_tokens.items():
            req = sched.requests[rid]
            if rid in preempted_before:  # re-admitted by this schedule()
                cached = req.num_computed_tokens - n
                record = {
                    "cached": cached,
                    "to_compute": req.num_tokens - cached,
                    "fed": 0,
                    "cut_short": False,
                }
                self.by_request.setdefault(rid, []).append(record)
                self._recomputing[rid] = record
            record = self._recomputing.get(rid)
            if record is not None:
                record["fed"] += n
                if req.num_computed_tokens >= req.num_tokens:  # this chunk ends the recompute
                    del self._recomputing[rid]


class VllmEngineState:
    """vLLM's own numbers of the engine's state, step by step, from its ``SchedulerStats`` and
    ``IterationStats``: the totals of its counters, its last gauges, and its tokens per step as
    vLLM's Prometheus logger records ``vllm:iteration_tokens_total``."""

    def __init__(self) -> None:
        self.stats_steps = 0  # steps that carried SchedulerStats
        self.prefix_cache_queries = self.prefix_cache_hits = 0
        self.spec_draft_tokens = self.spec_accepted_tokens = 0
        self.kv_cache_usage: float | None = None
        self.running: int | None = None
        self.waiting: int | None = None
        self.max_kv_cache_usage = 0.0
        self.iteration_tokens: list[int] = []
        # Lookups of re-admitted preempted requests (tokens looked up, found cached), which vLLM keeps
        # apart from vllm:prefix_cache_queries / _hits.
        self.preempted_prefix_queries = self.preempted_prefix_hits = 0
        # vllm:prompt_tokens_by_source, as vLLM's Prometheus logger adds it up.
        self.prompt_tokens_by_source = {"local_compute": 0, "local_cache_hit": 0, "external_kv_transfer": 0}

    def add(self, engine_outputs, iteration: IterationStats) -> None:
        if engine_outputs.outputs:  # vLLM makes IterationStats only for steps with outputs
            self.iteration_tokens.append(
                iteration.prompt_token_stats.computed + iteration.num_generation_tokens
            )
            for source in self.prompt_tokens_by_source:
                self.prompt_tokens_by_source[source] += iteration.prompt_token_stats.get_by_source(source)
        stats = engine_outputs.scheduler_stats
        if stats is None:
            return
        self.stats_steps += 1
        self.prefix_cache_queries += stats.prefix_cache_stats.queries
        self.prefix_cache_hits += stats.prefix_cache_stats.hits
        self.preempted_prefix_queries += stats.prefix_cache_stats.preempted_queries
        self.preempted_prefix_hits += stats.prefix_cache_stats.preempted_hits
        if stats.spec_decoding_stats is not None:
            self.spec_draft_tokens += stats.spec_decoding_stats.num_draft_tokens
            self.spec_accepted_tokens += stats.spec_decoding_stats.num_accepted_tokens
        self.kv_cache_usage = stats.kv_cache_usage
        self.max_kv_cache_usage = max(self.max_kv_cache_usage, stats.kv_cache_usage)
        self.running = stats.num_running_reqs
        self.waiting = stats.num_waiting_reqs + stats.num_skipped_waiting_reqs


def propose_drafts(scenario: Scenario, sched: Scheduler, request_ids: list[str]) -> None:
    """The drafter's part of a step: draft tokens for the next step, handed in as vLLM's proposer does."""
    live = [rid for rid in request_ids if rid in sched.requests and not sched.requests[rid].is_finished()]
    drafts = [[OTHER_TOKEN] * scenario.num_speculative_tokens for _ in live]
    sched.update_draft_token_ids(DraftTokenIds(live, drafts))  # vLLM drops them for prefill chunks


def class_functions() -> dict:
    """The functions the instrumentor wraps, as found in the classes' own namespaces."""
    names = {
        OutputProcessor: ("add_request", "process_outputs", "abort_requests", "update_scheduler_stats"),
        Scheduler: ("__init__", "schedule"),
    }
    return {f"{cls.__name__}.{n}": vars(cls).get(n) for cls, ns in names.items() for n in ns}


if __name__ == "__main__":
    model_dir = tiny_llama_dir()
    modes = [a.split("=", 1)[1] for a in sys.argv[2:] if a.startswith("--export-mode=")]
    export_mode = modes[-1] if modes else "process"
    runs = {scenario.name: run(scenario, model_dir, export_mode) for scenario in SCENARIOS}
    if "--print" in sys.argv[2:]:
        for name, result in runs.items():
            print_timelines(name, result["vllm_timeline"])
    with open(sys.argv[1], "w") as f:
        json.dump({"scenarios": runs}, f, indent=1)
