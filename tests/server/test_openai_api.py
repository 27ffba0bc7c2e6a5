"""The official ``openai`` client against ``otel-llm serve``'s app: traces join the caller's, streaming,
and preemptions caused through the HTTP API."""

from __future__ import annotations

import asyncio

import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, format_trace_id
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_llm import semconv as sc
from tests.server.conftest import MODEL, Served


def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url + "/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def served(serve) -> Served:
    return serve(num_kv_blocks=32)


def caller_span():
    """A span in the test's own SDK (the caller's process), and the headers that carry it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test-caller"), exporter


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_caller_span_is_parent_of_llm_request(served: Served, api: str) -> None:
    tracer, _ = caller_span()
    with tracer.start_as_current_span("caller", kind=SpanKind.CLIENT) as span:
        headers: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(headers)
        if api == "completions":
            raw = client(served).completions.with_raw_response.create(
                model=MODEL, prompt="Hello there", max_tokens=5, extra_headers=headers
            )
            text = raw.parse().choices[0].text
        else:
            raw = client(served).chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Hello there"}],
                max_tokens=5,
                extra_headers=headers,
            )
            text = raw.parse().choices[0].message.content
    caller = span.get_span_context()
    root = served.request_span(raw.headers["x-request-id"])
    assert root.context.trace_id == caller.trace_id
    assert root.parent is not None and root.parent.span_id == caller.span_id and root.parent.is_remote
    assert root.kind is SpanKind.SERVER
    assert root.status.status_code is not StatusCode.ERROR
    assert raw.headers["x-trace-id"] == format_trace_id(caller.trace_id)
    _, trace_hex, span_hex, _ = raw.headers["traceparent"].split("-")
    assert (int(trace_hex, 16), int(span_hex, 16)) == (root.context.trace_id, root.context.span_id)
    assert len(text) == 5
    assert root.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
    assert raw.parse().usage.completion_tokens == 5


def test_without_traceparent_the_header_names_a_new_trace(served: Served) -> None:
    raw = client(served).completions.with_raw_response.create(model=MODEL, prompt="Hi", max_tokens=3)
    root = served.request_span(raw.headers["x-request-id"])
    assert root.parent is None
    assert raw.headers["x-trace-id"] == format_trace_id(root.context.trace_id)


def test_streaming_chat_delivers_every_token_then_done(served: Served) -> None:
    tracer, _ = caller_span()
    with tracer.start_as_current_span("caller") as span:
        headers: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(headers)
        with client(served).chat.completions.with_streaming_response.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "Stream, please"},
            ],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers,
        ) as response:
            request_id = response.headers["x-request-id"]
            chunks = list(response.parse())
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len("".join(pieces)) == 12 and len(pieces) > 1  # arrived in several chunks
    assert reasons == [sc.REASON_LENGTH]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    root = served.request_span(request_id)
    assert root.context.trace_id == span.get_span_context().trace_id
    assert root.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == (sc.REASON_LENGTH,)


def test_streaming_completion_with_raw_sse_lines(served: Served) -> None:
    stream = client(served).completions.create(model=MODEL, prompt="count", max_tokens=7, stream=True)
    chunks = list(stream)
    assert len("".join(c.choices[0].text for c in chunks)) == 7
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == [sc.REASON_LENGTH]
    assert served.request_span(chunks[0].id).attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 7


def test_models_lists_the_served_model(served: Served) -> None:
    assert [m.id for m in client(served).models.list()] == [MODEL]


def test_concurrent_requests_on_a_tiny_kv_cache_preempt(serve) -> None:
    # 4 blocks of 16 slots, and each request (10 prompt + 40 output tokens) needs all 4 at its end:
    # any two that decode at the same time cannot both keep their KV cache.
    small = serve(num_kv_blocks=4)
    prompts = [f"request {i:02d}" for i in range(4)]

    async def call_all() -> list[openai.types.Completion]:
        async with openai.AsyncOpenAI(
            base_url=small.base_url + "/v1", api_key="unused", max_retries=0, timeout=60
        ) as aclient:
            calls = [
                aclient.completions.with_raw_response.create(model=MODEL, prompt=p, max_tokens=40)
                for p in prompts
            ]
            return await asyncio.gather(*calls)

    raws = asyncio.run(call_all())
    for raw in raws:
        assert len(raw.parse().choices[0].text) == 40 and raw.parse().choices[0].finish_reason == "length"
    roots = [small.request_span(raw.headers["x-request-id"]) for raw in raws]
    preempted = [s for s in small.spans.get_finished_spans() if s.name == sc.SPAN_PREEMPTED]
    assert small.engine.num_preemptions >= 1
    assert preempted, "a KV cache this small must preempt"
    assert {s.context.trace_id for s in preempted} <= {r.context.trace_id for r in roots}
    assert sum(r.attributes.get(sc.LLM_PREEMPTIONS, 0) for r in roots) == len(preempted)


def test_a_stop_sequence_ends_the_answer_without_it(served: Served) -> None:
    free = client(served).completions.create(model=MODEL, prompt="stop here", max_tokens=12).choices[0].text
    # The first new one-byte character after the start: the same prompt reaches it again (greedy decoding).
    at = next(i for i, ch in enumerate(free) if i > 0 and ch.isascii() and ch not in free[:i])
    raw = client(served).completions.with_raw_response.create(
        model=MODEL, prompt="stop here", max_tokens=12, stop=free[at]
    )
    answer = raw.parse()
    assert (answer.choices[0].text, answer.choices[0].finish_reason) == (free[:at], sc.REASON_STOP)
    assert answer.usage.completion_tokens == at + 1  # the stop token was generated, so it counts
    root = served.request_span(raw.headers["x-request-id"])
    assert root.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == at + 1
    streamed = list(
        client(served).completions.create(
            model=MODEL,
            prompt="stop here",
            max_tokens=12,
            stop=[free[at]],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == free[:at]
    assert [c.choices[0].finish_reason for c in streamed if c.choices and c.choices[0].finish_reason] == [
        sc.REASON_STOP
    ]
    assert streamed[-1].usage is not None and streamed[-1].usage.completion_tokens == at + 1


def test_the_engine_reports_to_the_tracker_it_was_given(served: Served) -> None:
    # The server reads ids, finish reasons and token counts from its request streams, not from the hook.
    assert served.engine.tracker is served.tracker
