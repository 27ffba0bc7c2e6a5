"""The reference engine under a workload built to stall: long prompts arrive into a decoding batch.

The engine reports each step's batch (``RequestTracker.batch``); its own log is the scheduler's
decisions (``spy_scheduler``) and its ``llm.engine.step`` spans (start, end, prefill tokens). Every step
that prefilled a long prompt must show up as a ``prefill`` stall of every request decoding through it,
naming the long request and its tokens, and every ``prefill`` stall must be such a step.
"""

from __future__ import annotations

import random

from engine_tools import Pipelines, spy_scheduler

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.kit.engine import EngineConfig, LLMEngine
from otel_llm.kit.engine.telemetry import ATTR_PREFILL_TOKENS

LONG = 1200  # prompt tokens: on a 2-core CPU its prefill step takes about 100 ms, a decode step 1-2 ms
ARRIVALS = {10: "long-a", 30: "long-b"}  # step after which each long prompt arrives


def _stalling_run(p: Pipelines):
    tracker = RequestTracker(tracer_provider=p.tracer_provider, meter_provider=p.meter_provider, model="tiny")
    config = EngineConfig(
        num_kv_blocks=256, block_size=16, max_num_batched_tokens=2048, max_num_seqs=16, step_spans=True
    )
    engine = LLMEngine(
        config, tracker=tracker, tracer_provider=p.tracer_provider, meter_provider=p.meter_provider
    )
    log = spy_scheduler(engine)
    rng = random.Random(7)
    decoding = [f"short-{k}" for k in range(4)]
    for rid in decoding:
        engine.add_request(f"tell me about {rid}", max_tokens=80, request_id=rid)
    n = 0
    while engine.has_unfinished():
        engine.step()
        n += 1
        if n in ARRIVALS:
            prompt = "".join(chr(rng.randrange(32, 127)) for _ in range(LONG))
            engine.add_request(prompt, max_tokens=4, request_id=ARRIVALS[n])
    tracker.force_flush()
    return decoding, log, p.spans.get_finished_spans()


def test_long_prefills_are_the_stalls_of_the_decoding_requests(pipelines: Pipelines) -> None:
    decoding, log, spans = _stalling_run(pipelines)
    # The scheduler's own log: the steps that fed a long prompt, and who was decoding in them.
    long_steps = [
        {rid: n for rid, n, prefill in step if prefill and rid in ARRIVALS.values()} for step in log.steps
    ]
    long_steps = [s for s in long_steps if s]
    assert [list(s.values()) for s in long_steps] == [[LONG], [LONG]], "each long prompt in one step"
    engine_steps = sorted(
        (s for s in spans if s.name == sc.SPAN_ENGINE_STEP and s.attributes[ATTR_PREFILL_TOKENS] >= LONG),
        key=lambda s: s.start_time,
    )
    assert len(engine_steps) == 2
    roots = {s.attributes[sc.LLM_REQUEST_ID]: s for s in spans if s.name == sc.SPAN_REQUEST}
    for rid in decoding:
        trace_id = roots[rid].context.trace_id
        (decode,) = [s for s in spans if s.name == sc.SPAN_DECODE and s.context.trace_id == trace_id]
        prefill_stalls = [
            e
            for e in decode.events
            if e.name == sc.EVENT_STALL and e.attributes[sc.LLM_STALL_CAUSE] == "prefill"
        ]
        assert len(prefill_stalls) == len(engine_steps), (rid, [dict(e.attributes) for e in decode.events])
        for stall, step, fed in zip(prefill_stalls, engine_steps, long_steps, strict=True):
            a = stall.attributes
            # The stall ends with the token of the step the engine spent on the long prompt.
            start = stall.timestamp - round(a[sc.LLM_STALL_DURATION] * 1e9)
            assert start - 1000 <= step.start_time and abs(step.end_time - stall.timestamp) <= 1000
            assert tuple(a[sc.LLM_STALL_REQUESTS]) == tuple(fed)
            assert tuple(a[sc.LLM_STALL_REQUEST_TOKENS]) == tuple(fed.values())
            assert a[sc.LLM_STALL_PREFILL_TOKENS] == step.attributes[ATTR_PREFILL_TOKENS] == LONG
        root = roots[rid].attributes
        assert (
            root[sc.LLM_STALLS] >= 2
            and root[sc.LLM_STALLED_PREFIX + "prefill"]
            >= sum(e.attributes[sc.LLM_STALL_DURATION] for e in prefill_stalls) - 1e-9
        )
