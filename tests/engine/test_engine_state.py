"""The reference engine feeds engine_state(): KV-cache usage, running / waiting, prefix-cache queries and
hits (real ones: prefix caching in its paged KV cache), tokens per step, and per request the prompt tokens
found cached. The metrics cross a real OTLP receiver and equal the engine's own numbers; tail sampling
keeps exactly the requests the engine really preempted."""

from __future__ import annotations

from typing import Any

from engine_tools import run_to_completion, spy_scheduler, tiny_engine
from otlp_receivers import GrpcReceiver, attributes

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.emit.sampling import TailSampling
from otel_llm.kit.engine import EngineConfig, LLMEngine
from otel_llm.setup import configure

SHARED = "You are a helpful assistant. Answer briefly: "  # 45 tokens: 11 full blocks of 4


def test_prefix_cache_hits_are_real_and_change_no_output() -> None:
    prompts = [SHARED + "why is the sky blue?", SHARED + "what is a KV cache?", SHARED + "hi"]
    outputs = {}
    for caching in (False, True):
        engine = tiny_engine(num_kv_blocks=40, enable_prefix_caching=caching)
        first = engine.add_request(prompts[0], max_tokens=5)
        run_to_completion(engine)  # its blocks are freed, and stay findable
        ids = [first] + [engine.add_request(p, max_tokens=5) for p in prompts[1:]]
        out = run_to_completion(engine)
        outputs[caching] = [out[rid][0] for rid in ids[1:]]
        if caching:
            # Each later prompt finds the 11 shared blocks (44 tokens) of the first in the cache.
            assert [engine.sequence(rid) for rid in ids[1:]] == [None, None]
            assert engine.scheduler.prefix_cache_hits == 2 * 44
        else:
            assert engine.scheduler.prefix_cache_hits == 0
    assert outputs[True] == outputs[False]  # greedy decoding: cached K/V give the same tokens


def test_cached_tokens_reach_the_request_span(pipelines) -> None:
    tracker = RequestTracker(
        tracer_provider=pipelines.tracer_provider, meter_provider=pipelines.meter_provider
    )
    engine = LLMEngine(
        EngineConfig(num_kv_blocks=40, block_size=4, max_num_batched_tokens=8), tracker=tracker
    )
    a = engine.add_request(SHARED + "one", max_tokens=3)
    run_to_completion(engine)
    b = engine.add_request(SHARED + "two", max_tokens=3)
    run_to_completion(engine)
    roots = {
        s.attributes[sc.LLM_REQUEST_ID]: s
        for s in pipelines.spans.get_finished_spans()
        if s.name == sc.SPAN_REQUEST
    }
    assert roots[a].attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 0
    assert roots[b].attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 44


def _last(rx: Any, name: str) -> Any:
    found = rx.metrics(name)
    return found[-1][1] if found else None


def _value(metric: Any, **attrs: str) -> float | None:
    if metric is None:
        return None
    data = getattr(metric, metric.WhichOneof("data"))
    for p in data.data_points:
        if all(attributes(p.attributes).get(k) == v for k, v in attrs.items()):
            return p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
    return None


def test_engine_state_metrics_arrive_over_otlp_with_the_engines_numbers(env, started) -> None:
    receiver = GrpcReceiver()
    receiver.start()
    started.append(receiver)
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    telemetry = configure(service_name="engine-state", set_global=False)
    started.append(telemetry)
    tracker = RequestTracker(
        tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider, model="tiny"
    )
    engine = LLMEngine(
        EngineConfig(num_kv_blocks=24, block_size=4, max_num_batched_tokens=32, max_num_seqs=4),
        tracker=tracker,
        meter_provider=telemetry.meter_provider,
        tracer_provider=telemetry.tracer_provider,
    )
    log = spy_scheduler(engine)
    engine.add_request(SHARED + "first", max_tokens=4)
    run_to_completion(engine)
    for i in range(8):
        engine.add_request(SHARED + f"question {i}?", max_tokens=12)
    for _ in range(10):  # stop mid-run: some running, some waiting, blocks in use
        engine.step()
    sched, bm = engine.scheduler, engine.scheduler.block_manager
    expected = {
        "usage": bm.usage,
        "running": len(sched.running),
        "waiting": len(sched.waiting),
        "queries": sched.prefix_cache_queries,
        "hits": sched.prefix_cache_hits,
        "step_samples": len(log.steps),
        "step_tokens": sum(n for step in log.steps for _, n, _ in step),
    }
    assert 0 < expected["usage"] < 1 and expected["running"] and expected["waiting"] and expected["hits"]
    tracker.force_flush()
    assert telemetry.force_flush(timeout_s=30)

    rx = receiver.collected

    def arrived(c: Any) -> bool:
        hist = _last(c, sc.METRIC_STEP_TOKENS)
        return (
            hist is not None and sum(p.count for p in hist.histogram.data_points) == expected["step_samples"]
        )

    assert rx.wait_until(arrived), "llm.server.step.tokens never arrived with every step"
    usage = _last(rx, sc.METRIC_KV_CACHE_USAGE)
    assert usage.WhichOneof("data") == "gauge" and usage.unit == sc.UNIT_RATIO
    assert _value(usage) == expected["usage"]
    requests = _last(rx, sc.METRIC_SCHEDULER_REQUESTS)
    assert requests.WhichOneof("data") == "gauge"
    assert _value(requests, **{sc.LLM_REQUEST_STATE: sc.STATE_RUNNING}) == expected["running"]
    assert _value(requests, **{sc.LLM_REQUEST_STATE: sc.STATE_WAITING}) == expected["waiting"]
    for name, key in ((sc.METRIC_PREFIX_CACHE_QUERIES, "queries"), (sc.METRIC_PREFIX_CACHE_HITS, "hits")):
        metric = _last(rx, name)
        assert metric.WhichOneof("data") == "sum" and metric.sum.is_monotonic, name
        assert _value(metric) == expected[key], name
    step = _last(rx, sc.METRIC_STEP_TOKENS).histogram
    assert sum(p.sum for p in step.data_points) == expected["step_tokens"]
    assert list(step.data_points[0].explicit_bounds) == list(sc.BUCKETS_STEP_TOKENS)
    assert attributes(step.data_points[0].attributes)[sc.GEN_AI_REQUEST_MODEL] == "tiny"
    # Nothing speculative happened: those counters were never reported, so never exported.
    assert _last(rx, sc.METRIC_SPEC_DRAFT_TOKENS) is None


def test_tail_sampling_keeps_exactly_the_requests_the_engine_preempted(make_harness) -> None:
    h = make_harness(tail_sampling=TailSampling(ratio=0.0))
    engine = LLMEngine(
        EngineConfig(num_kv_blocks=10, block_size=4, max_num_batched_tokens=8), tracker=h.tracker
    )
    log = spy_scheduler(engine)
    ids = [engine.add_request(p, max_tokens=n) for p, n in [("hi", 20), ("yo!", 18), ("abc", 15), ("q", 9)]]
    run_to_completion(engine)

    preempted = {rid for rid, _ in log.preemptions}
    assert preempted and preempted != set(ids), "the workload should preempt some requests, not all"
    assert {s.attributes[sc.LLM_REQUEST_ID] for s in h.roots()} == preempted
    points = h.metrics()
    decisions = {
        (p.attributes[sc.LLM_SAMPLING_DECISION], p.attributes[sc.LLM_SAMPLING_REASON]): p.value
        for p in points[sc.METRIC_SAMPLING_DECISIONS]
    }
    assert decisions == {("keep", "preempted"): len(preempted), ("drop", "ratio"): len(ids) - len(preempted)}
    (requests,) = points[sc.METRIC_REQUESTS]
    assert requests.value == len(ids)  # every request still counts
    (preemptions,) = points[sc.METRIC_PREEMPTIONS]
    assert preemptions.value == len(log.preemptions)


def test_a_tracker_without_engine_state_still_works() -> None:
    """The engine calls only the five hooks on a tracker that has no engine_state (e.g. an older one)."""
    calls: list[str] = []

    class FiveCalls:
        def queued(self, *a: Any, **k: Any) -> None:
            calls.append("queued")

        def scheduled(self, ids: Any, ts: float | None = None) -> None:
            calls.append("scheduled")

        def tokens(self, *a: Any, **k: Any) -> None:
            calls.append("tokens")

        def preempted(self, *a: Any, **k: Any) -> None:
            calls.append("preempted")

        def finished(self, *a: Any, **k: Any) -> None:
            calls.append("finished")

    engine = LLMEngine(EngineConfig(num_kv_blocks=8, block_size=4), tracker=FiveCalls())
    engine.add_request("hello", max_tokens=3)
    run_to_completion(engine)
    assert calls[0] == "queued" and calls[-1] == "finished" and "scheduled" in calls
