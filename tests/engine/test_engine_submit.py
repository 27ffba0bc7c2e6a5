"""``AsyncLLMEngine.submit()``: a request's id and trace context exist as soon as it is queued, before its
first token; its outputs carry the finish reason; a reader that leaves early aborts it (reason ``abort``
in its trace). A real engine, tracker and SDK pipeline throughout."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterator

import pytest
from engine_tools import Pipelines
from opentelemetry.trace import format_span_id, format_trace_id

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.kit.engine import AsyncLLMEngine, EngineConfig, LLMEngine, RequestOutput
from otel_llm.kit.engine.async_engine import RequestStream

CALLER = "00-0af7651916cd43dd8f448eb211c80319-b7ad6b7169203331-01"  # W3C's example traceparent
WAIT_S = 10.0


@pytest.fixture
def engine(pipelines: Pipelines) -> Iterator[LLMEngine]:
    tracker = RequestTracker(tracer_provider=pipelines.tracer_provider, model="tiny")
    yield LLMEngine(EngineConfig(num_kv_blocks=16, block_size=4), tracker=tracker)


def request_span(pipelines: Pipelines, request_id: str):
    spans = [
        s
        for s in pipelines.spans.get_finished_spans()
        if s.name == sc.SPAN_REQUEST and s.attributes[sc.LLM_REQUEST_ID] == request_id
    ]
    assert len(spans) == 1, f"one llm.request span for {request_id}, got {len(spans)}"
    return spans[0]


def gate_steps(engine: LLMEngine) -> threading.Event:
    """Hold every engine step (in the step thread) until the returned event is set."""
    step, gate = engine.step, threading.Event()

    def gated_step() -> list[RequestOutput]:
        assert gate.wait(WAIT_S), "the test never let the step run"
        return step()

    engine.step = gated_step  # type: ignore[method-assign]
    return gate


async def until_idle(engine: LLMEngine) -> None:
    deadline = time.monotonic() + WAIT_S
    while engine.has_unfinished():
        assert time.monotonic() < deadline, "the engine still runs the request"
        await asyncio.sleep(0.01)


def test_id_and_traceparent_are_known_before_the_first_token(engine: LLMEngine, pipelines: Pipelines) -> None:
    gate = gate_steps(engine)

    async def main() -> tuple[RequestStream, list[RequestOutput]]:
        front = AsyncLLMEngine(engine)
        outputs = await front.submit("hello", max_tokens=6, request_id="r1", carrier={"traceparent": CALLER})
        # The step that would make the first token is held, so everything known now came from queuing.
        assert outputs.request_id == "r1" and outputs.traceparent is not None
        assert engine.sequence("r1") is not None and outputs.num_output_tokens == 0
        gate.set()
        items = [out async for out in outputs]
        await front.aclose()
        return outputs, items

    outputs, items = asyncio.run(main())
    version, trace_hex, span_hex, _ = outputs.traceparent.split("-")
    root = request_span(pipelines, "r1")
    assert version == "00" and trace_hex == CALLER.split("-")[1]  # joined the caller's trace
    assert (trace_hex, span_hex) == (
        format_trace_id(root.context.trace_id),
        format_span_id(root.context.span_id),
    )
    assert [len(out.new_token_ids) for out in items] == [1] * 6
    assert [out.finish_reason for out in items] == [None] * 5 + [sc.REASON_LENGTH]
    assert [out.finished for out in items] == [False] * 5 + [True]
    assert (outputs.finish_reason, outputs.num_output_tokens, outputs.finished) == (sc.REASON_LENGTH, 6, True)


def test_a_stop_token_ends_the_stream_with_reason_stop(engine: LLMEngine) -> None:
    reference = LLMEngine(EngineConfig(num_kv_blocks=16, block_size=4))
    reference.add_request("stop here", max_tokens=8, request_id="ref")
    produced: list[int] = []
    while reference.has_unfinished():
        produced += [t for out in reference.step() for t in out.new_token_ids]
    stop = produced[2]  # greedy decoding: the same prompt makes the same tokens again
    expected = produced[: produced.index(stop) + 1]

    async def main() -> list[RequestOutput]:
        front = AsyncLLMEngine(engine)
        items = [out async for out in await front.submit("stop here", max_tokens=8, stop_token_ids=[stop])]
        await front.aclose()
        return items

    items = asyncio.run(main())
    assert [t for out in items for t in out.new_token_ids] == expected
    assert items[-1].finish_reason == sc.REASON_STOP and items[-1].finished


@pytest.mark.parametrize("leave", ["aclose", "break out of async with", "drop the stream"])
def test_leaving_early_aborts_the_request(engine: LLMEngine, pipelines: Pipelines, leave: str) -> None:
    async def main() -> None:
        front = AsyncLLMEngine(engine)
        if leave == "aclose":
            outputs = await front.submit("abandoned", max_tokens=40, request_id="r")
            await anext(outputs)
            await outputs.aclose()
        elif leave == "break out of async with":
            async with await front.submit("abandoned", max_tokens=40, request_id="r") as outputs:
                async for _ in outputs:
                    break
        else:
            outputs = await front.submit("abandoned", max_tokens=40, request_id="r")
            await anext(outputs)
            del outputs  # no aclose(): the stream's finalizer aborts it, as an async generator's would
            gc.collect()
        await until_idle(engine)
        await front.aclose()

    asyncio.run(main())
    root = request_span(pipelines, "r")
    assert root.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == (sc.REASON_ABORT,)
    assert 1 <= root.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] < 40
    assert engine.scheduler.block_manager.num_free_blocks == engine.scheduler.block_manager.num_blocks


def test_arrival_ts_starts_the_request_before_it_was_queued(engine: LLMEngine, pipelines: Pipelines) -> None:
    early_s = 5.0

    async def main() -> None:
        front = AsyncLLMEngine(engine)
        arrival = time.monotonic() - early_s  # as if the HTTP request had come in that long ago
        await front.generate("late", max_tokens=2, request_id="late", arrival_ts=arrival)
        await front.aclose()

    asyncio.run(main())
    root = request_span(pipelines, "late")
    (queued,) = [e for e in root.events if e.name == sc.EVENT_QUEUED]
    assert queued.timestamp - root.start_time >= early_s * 1e9 - 1e6  # allow ns rounding of the clocks


def test_a_request_the_engine_cannot_run_fails_at_submit(engine: LLMEngine, pipelines: Pipelines) -> None:
    async def main() -> None:
        front = AsyncLLMEngine(engine)
        with pytest.raises(ValueError, match="max_tokens"):
            await front.submit("x", max_tokens=10_000)
        outputs = await front.submit("x", max_tokens=2, request_id="same")
        with pytest.raises(ValueError, match="already"):
            await front.submit("x", max_tokens=2, request_id="same")
        assert [out.finish_reason async for out in outputs][-1] == sc.REASON_LENGTH
        await front.aclose()

    asyncio.run(main())
    roots = [s for s in pipelines.spans.get_finished_spans() if s.name == sc.SPAN_REQUEST]
    assert [s.attributes[sc.LLM_REQUEST_ID] for s in roots] == ["same"]  # the refused ones left no trace
