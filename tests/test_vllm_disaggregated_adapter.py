"""vLLM's disaggregated prefill/decode through the vLLM adapter: the request's ``kv_transfer_params``
picks the tracker's role, the prefill instance's carrier joins the params vLLM returns, and the decode
instance continues the trace from them.

vLLM is not needed here: the adapter reads vLLM's requests, outputs and events by attribute name, so
plain objects with those attributes stand in for them (the real engines run in
``tests/vllm/test_vllm_disaggregated.py``); the trackers and the OpenTelemetry SDK are real.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from otel_llm import semconv as sc
from otel_llm.hooks.handoff import CARRIER_KEYS, KEY_ARRIVAL, KEY_PARENT, KEY_TAIL, KEY_TRACEPARENT
from otel_llm.integrations.vllm import disaggregated as pd
from otel_llm.integrations.vllm.adapter import VLLMAdapter
from otel_llm.integrations.vllm.instrumentor import VLLMInstrumentor

CONNECTOR_PARAMS = {"do_remote_prefill": True, "remote_block_ids": [3, 4], "remote_host": "10.0.0.2"}


def request(rid: str, params: dict[str, Any] | None) -> SimpleNamespace:
    extra = {"kv_transfer_params": params} if params is not None else None
    return SimpleNamespace(
        request_id=rid,
        external_req_id=rid,
        arrival_time=time.time(),
        prompt_token_ids=list(range(40)),
        sampling_params=SimpleNamespace(extra_args=extra),
    )


def event(name: str, ts: float) -> SimpleNamespace:
    return SimpleNamespace(type=SimpleNamespace(name=name), timestamp=ts)


def output(
    rid: str, events: list[Any], tokens: int, finish: str | None = None, params: Any = None
) -> SimpleNamespace:
    reason = SimpleNamespace(name=finish) if finish is not None else None
    return SimpleNamespace(
        request_id=rid,
        events=events,
        new_token_ids=[7] * tokens,
        finish_reason=reason,
        kv_transfer_params=params,
    )


def by_role(make_harness: Any) -> tuple[dict[str, Any], Callable[..., Any]]:
    """One harness per role, and a ``tracker_for`` that picks by the role the adapter asks for."""
    harnesses = {role: make_harness(role=role) for role in sc.ROLES}

    def tracker_for(model: str | None, operation: str, role: str = sc.ROLE_BOTH) -> Any:
        return harnesses[role].tracker

    return harnesses, tracker_for


def prefill(adapter: VLLMAdapter, rid: str, connector: Any, finish: str = "LENGTH") -> SimpleNamespace:
    """A prefill-only request (max_tokens=1): queued, scheduled, one token, finished in one output."""
    adapter.request_added(request(rid, {"do_remote_decode": True}))
    now = time.monotonic()
    out = output(rid, [event("QUEUED", now - 0.3), event("SCHEDULED", now - 0.2)], 1, finish, connector)
    adapter.outputs([out], batch_ts=now - 0.1)
    adapter.settle([out], still_open=())
    return out


def test_role_follows_the_request_params() -> None:
    assert pd.request_role(None) == pd.request_role({}) == sc.ROLE_BOTH
    assert pd.request_role({"do_remote_decode": True}) == sc.ROLE_PREFILL
    assert pd.request_role({"do_remote_prefill": True, "remote_block_ids": []}) == sc.ROLE_DECODE
    # the example connector's decode side has no flag: our carrier alone marks it
    carrier = {KEY_TRACEPARENT: "00-" + "1" * 32 + "-" + "2" * 16 + "-01", KEY_ARRIVAL: "12.5"}
    assert pd.request_role(carrier) == sc.ROLE_DECODE
    assert pd.request_role({"do_remote_decode": "yes"}) == sc.ROLE_BOTH  # vLLM's connectors test `is True`
    assert pd.carrier_in({**carrier, "remote_block_ids": [1], KEY_TAIL: 3}) == carrier  # strings only


def test_one_trace_across_prefill_and_decode_adapters(make_harness: Any) -> None:
    harnesses, tracker_for = by_role(make_harness)
    prefill_side, decode_side = VLLMAdapter(tracker_for, "m"), VLLMAdapter(tracker_for, "m")
    out = prefill(prefill_side, "p1", dict(CONNECTOR_PARAMS))
    returned = out.kv_transfer_params
    # the connector's keys untouched, ours added: the caller forwards the whole dict
    assert {k: returned[k] for k in CONNECTOR_PARAMS} == CONNECTOR_PARAMS
    assert returned[KEY_TAIL] == "keep" and KEY_ARRIVAL in returned
    assert "p1" not in harnesses[sc.ROLE_PREFILL].tracker  # handed off (kv_sent), not in flight

    decode_side.request_added(request("d1", dict(returned)))
    now = time.monotonic()
    first = output("d1", [event("QUEUED", now - 0.05), event("SCHEDULED", now - 0.04)], 1)
    decode_side.outputs([first], batch_ts=now - 0.03)
    decode_side.settle([first], still_open={"d1"})
    last = output("d1", [], 1, "LENGTH")
    decode_side.outputs([last], batch_ts=now)
    decode_side.settle([last], still_open=())

    pre_spans = harnesses[sc.ROLE_PREFILL].finished_spans()
    dec_spans = harnesses[sc.ROLE_DECODE].finished_spans()
    assert not harnesses[sc.ROLE_BOTH].finished_spans()
    assert len({s.context.trace_id for s in pre_spans + dec_spans}) == 1
    (root,) = [s for s in dec_spans if s.name == sc.SPAN_REQUEST]
    assert not [s for s in pre_spans if s.name == sc.SPAN_REQUEST]
    (p_inst,) = [s for s in pre_spans if s.name == sc.SPAN_INSTANCE_PREFILL]
    (d_inst,) = [s for s in dec_spans if s.name == sc.SPAN_INSTANCE_DECODE]
    assert p_inst.parent.span_id == d_inst.parent.span_id == root.context.span_id
    # the arrival travelled in the carrier (each tracker converts with its own clock offset: a few µs)
    assert abs(root.start_time - p_inst.start_time) <= 5_000
    assert (
        p_inst.attributes[sc.LLM_ROLE] == sc.ROLE_PREFILL and root.attributes[sc.LLM_ROLE] == sc.ROLE_DECODE
    )
    assert root.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2
    assert [s for s in pre_spans if s.name == sc.SPAN_KV_TRANSFER]  # [F_p, K_p] on the prefill side


def test_example_connector_answers_nothing_so_the_params_are_ours_alone(make_harness: Any) -> None:
    harnesses, tracker_for = by_role(make_harness)
    out = prefill(VLLMAdapter(tracker_for), "p1", None)
    assert set(out.kv_transfer_params) == set(CARRIER_KEYS) - {KEY_PARENT}  # no caller: no parent
    assert pd.request_role(out.kv_transfer_params) == sc.ROLE_DECODE
    assert not harnesses[sc.ROLE_PREFILL].roots()  # handed off all the same


def test_an_aborted_prefill_request_ends_on_the_prefill_instance(make_harness: Any) -> None:
    harnesses, tracker_for = by_role(make_harness)
    out = prefill(VLLMAdapter(tracker_for), "p1", None, finish="ABORT")
    assert out.kv_transfer_params is None  # nothing goes on to a decode instance
    (root,) = harnesses[sc.ROLE_PREFILL].roots()  # the prefill tracker emits llm.request itself
    assert root.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("abort",)


def test_plain_requests_keep_the_role_both_tracker(make_harness: Any) -> None:
    harnesses, tracker_for = by_role(make_harness)
    adapter = VLLMAdapter(tracker_for)
    adapter.request_added(request("r1", None))
    now = time.monotonic()
    out = output("r1", [event("QUEUED", now - 0.2), event("SCHEDULED", now - 0.1)], 1, "LENGTH", None)
    adapter.outputs([out], batch_ts=now)
    adapter.settle([out], still_open=())
    assert out.kv_transfer_params is None
    (root,) = harnesses[sc.ROLE_BOTH].roots()
    assert sc.LLM_ROLE not in root.attributes


def test_a_given_tracker_of_role_both_is_not_handed_off(make_harness: Any) -> None:
    """``instrument(tracker=...)`` with a role-both tracker: P/D requests end where they are, whole."""
    h = make_harness()
    out = prefill(VLLMAdapter(lambda model, operation, role="both": h.tracker), "p1", None)
    assert out.kv_transfer_params is None
    assert len(h.roots()) == 1


@pytest.fixture
def instrumentor(make_harness: Any) -> Any:
    h = make_harness()
    inst = VLLMInstrumentor()
    inst.instrument(tracer_provider=h.tracer_provider, meter_provider=h.meter_provider)
    yield inst
    inst.uninstrument()


def test_the_instrumentor_builds_one_tracker_per_role(instrumentor: Any) -> None:
    both = VLLMInstrumentor.state().tracker_for("m", "chat")
    pre = VLLMInstrumentor.state().tracker_for("m", "chat", sc.ROLE_PREFILL)
    dec = VLLMInstrumentor.state().tracker_for("m", "chat", sc.ROLE_DECODE)
    assert (both.role, pre.role, dec.role) == (sc.ROLE_BOTH, sc.ROLE_PREFILL, sc.ROLE_DECODE)
    assert VLLMInstrumentor.state().tracker_for("m", "chat", sc.ROLE_PREFILL) is pre


def test_connector_keys_are_never_replaced() -> None:
    out = output("p1", [], 1, "LENGTH", {"traceparent": "theirs", "remote_engine_id": "e1"})
    pd.attach_carrier(out, {KEY_TRACEPARENT: "ours", KEY_ARRIVAL: "1.0"})
    assert out.kv_transfer_params == {"traceparent": "theirs", "remote_engine_id": "e1", KEY_ARRIVAL: "1.0"}


def test_a_given_tracker_of_another_role_warns_once(make_harness: Any, caplog: Any) -> None:
    h = make_harness()
    inst = VLLMInstrumentor()
    inst.instrument(tracker=h.tracker)
    try:
        with caplog.at_level("WARNING", logger="otel_llm"):
            for _ in range(3):
                assert VLLMInstrumentor.state().tracker_for("m", "chat", sc.ROLE_PREFILL) is h.tracker
        assert len([r for r in caplog.records if "role" in r.getMessage()]) == 1
    finally:
        inst.uninstrument()
