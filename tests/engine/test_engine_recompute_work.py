"""The reference engine reports what each preemption cost in work, exactly: per rescheduling, the tokens
its block manager found in the prefix cache and the tokens it then fed the model to rebuild the request's
KV cache, compared with the spans, the request sums and the counters of the same run.

The engine's own numbers are read by a spy around ``Scheduler.schedule`` (the real scheduler and block
manager): right after it re-admits a preempted sequence, the sequence's computed tokens (its cached
blocks, also counted from the block hashes the block manager matched) and what is left of its context;
then, step by step, the tokens the scheduler really gives it until it yields a token again, or is
preempted before that. The tracker never sees those numbers: it derives the recompute from the token
counts it was given, so a test that passes shows the derivation equals the engine's work.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from engine_tools import run_to_completion

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.kit.engine import EngineConfig, LLMEngine

SHARED = "sys prompt. "  # three full blocks of 4 tokens that every request's prompt starts with


@dataclass
class Rescheduling:
    """One re-admission of a preempted sequence, in the engine's own numbers (tokens)."""

    output_before: int  # tokens it had produced when preempted
    cached: int = 0  # its computed tokens right after re-admission: blocks found in the prefix cache
    cached_blocks: int = 0  # of those, in blocks the block manager matched by hash
    to_compute: int = 0  # num_tokens - num_computed_tokens right after re-admission
    fed: int = 0  # tokens the scheduler gave it from then on until a token or the next preemption
    cut_short: bool = False  # preempted again before it yielded a token


@dataclass
class EngineLog:
    reschedulings: dict[str, list[Rescheduling]] = field(default_factory=dict)
    recomputing: dict[str, Rescheduling] = field(default_factory=dict)


def spy_recomputes(engine: LLMEngine) -> EngineLog:
    """Wrap the engine's scheduler so that each step writes down its reschedulings' work."""
    log = EngineLog()
    scheduler = engine.scheduler
    schedule = scheduler.schedule
    block_size = scheduler.block_manager.block_size

    def recording_schedule() -> Any:
        batch = schedule()
        for seq in batch.preempted:
            cut = log.recomputing.pop(seq.request_id, None)
            if cut is not None:
                cut.cut_short = True
            log.reschedulings.setdefault(seq.request_id, []).append(Rescheduling(seq.num_output_tokens))
        for seq in batch.newly_scheduled:
            if seq.num_preemptions:
                r = log.reschedulings[seq.request_id][-1]
                r.cached = seq.num_computed_tokens
                r.cached_blocks = len(seq.block_hashes) * block_size
                r.to_compute = seq.num_tokens - seq.num_computed_tokens
                log.recomputing[seq.request_id] = r
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            r = log.recomputing.get(seq.request_id)
            if r is not None:
                r.fed += n
                if seq.num_computed_tokens + n == seq.num_tokens:  # this chunk ends the recompute
                    del log.recomputing[seq.request_id]
        return batch

    scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    return log


def workload(seed: int, n: int) -> list[tuple[str, int]]:
    """Prompts that share a prefix, and output lengths, drawn from ``seed`` (deterministic scheduling)."""
    rng = random.Random(seed)
    return [
        (SHARED + "".join(rng.choice("abcdefgh ") for _ in range(rng.randint(3, 20))), rng.randint(4, 24))
        for _ in range(n)
    ]


def recompute_spans(pipelines: Any) -> dict[str, list[Any]]:
    """Each request's llm.recompute spans, in time order, by request id."""
    spans = pipelines.spans.get_finished_spans()
    rid_of = {s.context.trace_id: s.attributes[sc.LLM_REQUEST_ID] for s in spans if s.name == sc.SPAN_REQUEST}
    out: dict[str, list[Any]] = {rid: [] for rid in rid_of.values()}
    for s in sorted(spans, key=lambda s: s.start_time):
        if s.name == sc.SPAN_RECOMPUTE:
            out[rid_of[s.context.trace_id]].append(s)
    return out


def counters(pipelines: Any, role: str | None = None) -> dict[str, Any]:
    """The counters' values of one collection (of the tracker with ``llm.role`` = ``role``, if given);
    the prompt tokens as a dict by source."""
    data = pipelines.reader.get_metrics_data()
    found: dict[str, Any] = {}
    for rm in data.resource_metrics:
        for scope in rm.scope_metrics:
            for metric in scope.metrics:
                points = [p for p in metric.data.data_points if p.attributes.get(sc.LLM_ROLE) == role]
                if metric.name == sc.METRIC_PROMPT_TOKENS:
                    found[metric.name] = {p.attributes[sc.LLM_PROMPT_TOKENS_SOURCE]: p.value for p in points}
                elif len(points) == 1 and hasattr(points[0], "value"):  # a counter or gauge
                    found[metric.name] = points[0].value
    return found


@pytest.fixture
def preempting_run(pipelines: Any) -> tuple[LLMEngine, EngineLog, dict[str, Any]]:
    tracker = RequestTracker(
        tracer_provider=pipelines.tracer_provider, meter_provider=pipelines.meter_provider, model="tiny"
    )
    engine = LLMEngine(
        EngineConfig(num_kv_blocks=14, block_size=4, max_num_batched_tokens=8), tracker=tracker
    )
    log = spy_recomputes(engine)
    for prompt, max_tokens in workload(7, 8):
        engine.add_request(prompt, max_tokens=max_tokens)
    run_to_completion(engine)
    return engine, log, counters(pipelines)


def test_the_run_has_every_kind_of_preemption(preempting_run: Any) -> None:
    _, log, _ = preempting_run
    every = [r for rs in log.reschedulings.values() for r in rs]
    assert any(r.output_before == 0 for r in every), "a preemption before the first token"
    assert any(r.output_before > 0 for r in every), "one after it"
    assert any(len(rs) > 1 for rs in log.reschedulings.values()), "a request preempted more than once"
    assert any(r.cut_short for r in every), "a recompute cut short by another preemption"
    assert any(r.cached > 0 for r in every), "a rescheduling that found blocks in the prefix cache"
    assert not log.recomputing, "every recompute ended"


def test_each_recompute_span_equals_the_engines_own_work(preempting_run: Any, pipelines: Any) -> None:
    engine, log, _ = preempting_run
    spans = recompute_spans(pipelines)
    for rid, reschedulings in log.reschedulings.items():
        got = [
            (s.attributes[sc.LLM_RECOMPUTE_CACHED_TOKENS], s.attributes[sc.LLM_RECOMPUTE_TOKENS])
            for s in spans[rid]
        ]
        assert got == [(r.cached, r.to_compute) for r in reschedulings], rid
        for r in reschedulings:
            assert r.cached == r.cached_blocks  # what it skipped is exactly the blocks matched by hash
            # The figure is the work the scheduler really did for the recompute, unless another
            # preemption cut it short first.
            assert (r.fed < r.to_compute) if r.cut_short else (r.fed == r.to_compute), (rid, r)
    assert sum(len(rs) for rs in log.reschedulings.values()) == engine.num_preemptions


def test_request_sums_and_counters_equal_the_engines_totals(preempting_run: Any, pipelines: Any) -> None:
    _, log, metrics = preempting_run
    roots = {
        s.attributes[sc.LLM_REQUEST_ID]: s
        for s in pipelines.spans.get_finished_spans()
        if s.name == sc.SPAN_REQUEST
    }
    for rid, reschedulings in log.reschedulings.items():
        attrs = roots[rid].attributes
        assert attrs[sc.LLM_PREEMPTIONS_RECOMPUTE_TOKENS] == sum(r.to_compute for r in reschedulings)
        assert attrs[sc.LLM_PREEMPTIONS_RECOMPUTE_CACHED_TOKENS] == sum(r.cached for r in reschedulings)
    every = [r for rs in log.reschedulings.values() for r in rs]
    assert metrics[sc.METRIC_RECOMPUTE_TOKENS] == sum(r.to_compute for r in every)
    assert metrics[sc.METRIC_RECOMPUTE_CACHED_TOKENS] == sum(r.cached for r in every)
    spans = recompute_spans(pipelines)
    assert metrics[sc.METRIC_RECOMPUTE_TOKENS] == sum(
        s.attributes[sc.LLM_RECOMPUTE_TOKENS] for ss in spans.values() for s in ss
    )


def test_prompt_tokens_by_source_equal_the_first_admissions(preempting_run: Any, pipelines: Any) -> None:
    engine, _, metrics = preempting_run
    sched = engine.scheduler
    by_source = metrics[sc.METRIC_PROMPT_TOKENS]
    assert by_source == {
        sc.PROMPT_SOURCE_COMPUTED: sched.prompt_tokens_computed,
        sc.PROMPT_SOURCE_PREFIX_CACHE: sched.prompt_tokens_cached,
        sc.PROMPT_SOURCE_KV_TRANSFER: 0,
    }
    # The same split from each request's own figures, on its llm.request span: once per request,
    # whatever its preemptions cost.
    roots = [s for s in pipelines.spans.get_finished_spans() if s.name == sc.SPAN_REQUEST]
    cached = sum(s.attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] for s in roots)
    prompts = sum(s.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] for s in roots)
    assert by_source[sc.PROMPT_SOURCE_PREFIX_CACHE] == cached > 0
    assert by_source[sc.PROMPT_SOURCE_COMPUTED] == prompts - cached


def test_a_decode_instance_counts_handed_in_prompts_as_transferred(pipelines: Any) -> None:
    """Prefill and decode engines in one process, the K/V handed over in memory: the decode side's
    prompt tokens come over the transfer, and its preemptions' figures are its own engine's."""
    prefill_tracker = RequestTracker(
        tracer_provider=pipelines.tracer_provider, meter_provider=pipelines.meter_provider, role="prefill"
    )
    decode_tracker = RequestTracker(
        tracer_provider=pipelines.tracer_provider, meter_provider=pipelines.meter_provider, role="decode"
    )
    prefill = LLMEngine(EngineConfig(num_kv_blocks=32, block_size=4, role="prefill"), tracker=prefill_tracker)
    decode = LLMEngine(
        EngineConfig(num_kv_blocks=14, block_size=4, max_num_batched_tokens=8, role="decode"),
        tracker=decode_tracker,
    )
    log = spy_recomputes(decode)
    prompts = workload(3, 6)
    for prompt, max_tokens in prompts:
        prefill.add_request(prompt, max_tokens=max_tokens)
    while prefill.has_unfinished() or decode.has_unfinished():
        prefill.step()
        for h in prefill.take_handoffs():
            prefill_tracker.kv_sent(h.request_id)
            now = time.monotonic()
            decode.add_handoff(h, now, now, int(h.kv.numel()) * h.kv.element_size())
        decode.step()
    assert decode.num_preemptions > 0, "the decode side must preempt"
    assert prefill.num_preemptions == 0  # so every llm.recompute span below is the decode side's
    prompt_total = sum(len(p.encode()) for p, _ in prompts)
    on_decode = counters(pipelines, sc.ROLE_DECODE)[sc.METRIC_PROMPT_TOKENS]
    on_prefill = counters(pipelines, sc.ROLE_PREFILL)[sc.METRIC_PROMPT_TOKENS]
    assert on_decode == {
        sc.PROMPT_SOURCE_COMPUTED: 0,
        sc.PROMPT_SOURCE_PREFIX_CACHE: 0,
        sc.PROMPT_SOURCE_KV_TRANSFER: decode.scheduler.prompt_tokens_transferred,
    }
    assert on_decode[sc.PROMPT_SOURCE_KV_TRANSFER] == prompt_total
    assert on_prefill[sc.PROMPT_SOURCE_KV_TRANSFER] == 0
    assert on_prefill[sc.PROMPT_SOURCE_COMPUTED] + on_prefill[sc.PROMPT_SOURCE_PREFIX_CACHE] == prompt_total
    spans = recompute_spans(pipelines)
    for rid, reschedulings in log.reschedulings.items():
        got = [
            (s.attributes[sc.LLM_RECOMPUTE_CACHED_TOKENS], s.attributes[sc.LLM_RECOMPUTE_TOKENS])
            for s in spans[rid]
        ]
        assert got == [(r.cached, r.to_compute) for r in reschedulings], rid
