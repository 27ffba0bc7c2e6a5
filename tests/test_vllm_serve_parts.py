"""Two parts of the vLLM integration that only `vllm serve` calls, without vLLM: the headers that put
vLLM's own ``llm_request`` span under ours, and what an API server says at start when it is one of
several. tests/vllm runs both on the real server (test_vllm_serve.py, test_vllm_serve_api_servers.py).

The tracker, its tracer provider and the SDK's resource detection are real; plain objects with vLLM
0.33's field names stand in for its ``EngineCoreRequest``, ``EngineCoreOutput`` and parsed arguments.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.integrations import patching
from otel_llm.integrations.vllm import api_server as serving
from otel_llm.integrations.vllm import providers
from otel_llm.integrations.vllm.adapter import VLLMAdapter

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def event(name: str, ts: float) -> SimpleNamespace:
    return SimpleNamespace(type=SimpleNamespace(name=name), timestamp=ts)


def test_vllms_span_gets_our_request_span_as_its_parent_with_the_callers_tracestate() -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracker = RequestTracker(tracer_provider=provider)
    adapter = VLLMAdapter(lambda *_: tracker)
    caller = {"traceparent": CALLER, "tracestate": "vendor=1"}
    adapter.request_added(
        SimpleNamespace(
            request_id="r", arrival_time=time.time(), prompt_token_ids=[1] * 8, trace_headers=caller
        )
    )
    assert adapter.parent_headers("r", caller) is None  # not opened yet: vLLM keeps its own headers
    t = time.monotonic()
    first = SimpleNamespace(
        request_id="r",
        new_token_ids=[7],
        events=[event("QUEUED", t), event("SCHEDULED", t + 0.01)],
        finish_reason=None,
        prefill_stats=None,
    )
    adapter.outputs([first], t + 0.02)
    headers = adapter.parent_headers("r", {"Traceparent": CALLER, "tracestate": "vendor=1"})
    adapter.settle([SimpleNamespace(request_id="r", finish_reason=SimpleNamespace(name="LENGTH"))], ())
    assert adapter.parent_headers("r", caller) is None  # finished

    (root,) = [s for s in spans.get_finished_spans() if s.name == sc.SPAN_REQUEST]
    assert root.parent is not None and f"{root.parent.span_id:016x}" == CALLER.split("-")[2]
    ours = f"00-{root.context.trace_id:032x}-{root.context.span_id:016x}-01"
    assert headers == {"traceparent": ours, "tracestate": "vendor=1"}


@pytest.fixture
def said(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """What the API server's start logs (``.messages``), each warning heard afresh."""
    monkeypatch.setattr(patching, "_warned", set())
    monkeypatch.delenv("OTEL_LLM_SHUTDOWN_TIMEOUT", raising=False)
    monkeypatch.delenv(providers.ENV_CONFIGURE, raising=False)
    caplog.set_level(logging.WARNING, logger=serving.log.name)
    return caplog


def api_server(count: int, shutdown_timeout: int) -> SimpleNamespace:
    return SimpleNamespace(api_server_count=count, shutdown_timeout=shutdown_timeout)


def about_shutdown(messages: list[str]) -> list[str]:
    return [m for m in messages if "--shutdown-timeout" in m]


def test_several_api_servers_with_vllms_default_shutdown_timeout_are_told_the_one_that_keeps_telemetry(
    said: pytest.LogCaptureFixture,
) -> None:
    serving.warn_of_several_api_servers(api_server(2, 0))
    (line,) = about_shutdown(said.messages)
    assert "kills its API servers 0 s after SIGTERM" in line and line.endswith("pass --shutdown-timeout 6")


def test_a_shutdown_timeout_that_covers_the_budget_is_not_warned_of(
    said: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    serving.warn_of_several_api_servers(api_server(2, 6))
    monkeypatch.setenv("OTEL_LLM_SHUTDOWN_TIMEOUT", "2")
    serving.warn_of_several_api_servers(api_server(2, 3))
    serving.warn_of_several_api_servers(api_server(1, 0))  # one API server: vLLM does not kill it
    assert about_shutdown(said.messages) == []
    serving.warn_of_several_api_servers(api_server(2, 2))
    assert about_shutdown(said.messages) and about_shutdown(said.messages)[0].endswith(
        "pass --shutdown-timeout 3"
    )


def test_several_api_servers_sharing_one_resource_are_warned_of_where_the_sdk_gives_no_instance(
    said: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """opentelemetry-sdk 1.45 and later detect a service.instance.id per process; older ones do not (the
    minimum-version tier runs this there). The expectation is the SDK's own resource."""
    serving.warn_of_several_api_servers(api_server(2, 6))
    one_resource = [m for m in said.messages if "under one resource" in m]
    if "service.instance.id" in Resource.create().attributes:
        assert one_resource == []
    else:
        assert len(one_resource) == 1 and "OTEL_LLM_VLLM_CONFIGURE=1" in one_resource[0]
    said.clear()
    patching._warned.clear()
    monkeypatch.setenv(providers.ENV_CONFIGURE, "1")  # configure() gives each process its own
    serving.warn_of_several_api_servers(api_server(2, 6))
    assert [m for m in said.messages if "under one resource" in m] == []
