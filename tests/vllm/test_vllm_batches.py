"""What each of vLLM's steps computed, as the tracker heard it, against vLLM 0.33's scheduler in the same run.

The engine core runs in the driver's process, so the integration hands each ``SchedulerOutput``'s
``num_scheduled_tokens`` to the tracker's ``batch()`` when the step's outputs arrive
(``otel_llm.integrations.vllm.compositions``). The driver writes down vLLM's side independently: every
step's ``num_scheduled_tokens`` as ``schedule()`` returned it, and what vLLM's own ``Request`` says the
tokens were (prompt, recompute after a preemption, one decode token, speculative). The tracker's side is
every ``batch()`` call the adapter made and the tracker's step log (a test-only probe of its private
state), and the ``llm.stall`` events on the spans.
"""

from __future__ import annotations

from typing import Any

import pytest
from cost_model import shares

from otel_llm import semconv as sc
from tests.vllm.conftest import needs_vllm, roots, trace_of

pytestmark = needs_vllm


def scheduled_steps(run: dict[str, Any]) -> list[dict[str, Any]]:
    """vLLM's steps that scheduled any tokens (schedule() with nothing to run makes no batch)."""
    return [s for s in run["vllm_steps"] if s["scheduled"]]


def test_every_step_reaches_batch_as_vllms_scheduler_made_it(any_run: dict[str, Any]) -> None:
    steps, calls = scheduled_steps(any_run), any_run["batch_calls"]
    assert steps, "the scenario scheduled nothing"
    assert [c["scheduled"] for c in calls] == [s["scheduled"] for s in steps]
    for call, step in zip(calls, steps):
        # The step began before its outputs were made: batch() carries the start of its scheduling.
        assert step["outputs_ts"] is None or call["ts"] <= step["outputs_ts"]
    assert [c["ts"] for c in calls] == sorted(c["ts"] for c in calls)


def expected_split(step: dict[str, Any]) -> dict[str, Any]:
    """The tracker's figures for one step, from vLLM's own account of its tokens: one token counts as
    decode (the hook's rule: the engine only counts tokens), more by what vLLM's Request says."""
    split = {"requests": len(step["scheduled"]), "prefill": 0, "recompute": 0, "decode": 0, "spec": 0}
    heavy = []
    for rid, n in step["scheduled"].items():
        if n == 1:
            split["decode"] += 1
            continue
        kind = step["kinds"][rid]
        split[kind] += n
        if kind in ("prefill", "recompute"):
            heavy.append([rid, n, kind])
    split["heavy"] = sorted(heavy, key=lambda h: (-h[1], h[0]))
    return split


def test_the_tracker_tells_each_steps_work_as_vllm_does(any_run: dict[str, Any]) -> None:
    steps, log = scheduled_steps(any_run), any_run["batch_log"]
    assert len(log) == len(steps)
    for k, (step, logged) in enumerate(zip(steps, log)):
        got = {key: logged[key] for key in ("requests", "prefill", "recompute", "decode", "spec")}
        got["heavy"] = sorted(logged["heavy"], key=lambda h: (-h[1], h[0]))
        assert got == expected_split(step), f"step {k}: {step}"


def test_the_scenarios_hold_every_kind_of_work(vllm_runs: dict[str, dict[str, Any]]) -> None:
    kinds = {
        kind
        for run in vllm_runs.values()
        for step in scheduled_steps(run)
        for rid, kind in step["kinds"].items()
        if step["scheduled"][rid] > 1 or kind == "decode"
    }
    assert kinds == {"prefill", "recompute", "decode", "spec"}


def token_steps(run: dict[str, Any], rid: str) -> list[int]:
    """The driver step that delivered each of the request's output tokens, in order (token k at [k-1])."""
    out = []
    for kind, _, step, n in sorted(run["vllm_timeline"][rid], key=lambda e: (e[2], e[1])):
        if kind == "TOKENS":
            out += [step] * n
    return out


def stall_events(run: dict[str, Any], rid: str) -> list[dict[str, Any]]:
    root = roots(run)[rid]
    decode = [s for s in trace_of(run, root) if s["name"] == sc.SPAN_DECODE]
    return [e["attributes"] for s in decode for e in s["events"] if e["name"] == sc.EVENT_STALL]


def test_prefill_stalls_name_what_vllms_steps_scheduled(vllm_runs: dict[str, dict[str, Any]]) -> None:
    """Scenario ``stall``: long prompts arrive into a decoding batch and their chunks share its steps.
    Each prefill stall's steps, prefill tokens and named requests are the steps of vLLM's between the
    stalled token and the one before, and what those steps scheduled for the other requests."""
    run = vllm_runs["stall"]
    steps = run["vllm_steps"]
    named: set[str] = set()
    for rid in ("t0", "t1"):
        delivered = token_steps(run, rid)
        prefill_stalls = [e for e in stall_events(run, rid) if e[sc.LLM_STALL_CAUSE] == sc.STALL_PREFILL]
        for event in prefill_stalls:
            token = event[sc.LLM_STALL_TOKEN]
            before, at = delivered[token - 2], delivered[token - 1]
            gap = [s for s in steps[before + 1 : at + 1] if s["scheduled"]]
            assert event[sc.LLM_STALL_STEPS] == len(gap)
            by_request: dict[str, int] = {}
            for step in gap:
                for other, n in step["scheduled"].items():
                    if other != rid and n > 1 and step["kinds"][other] == "prefill":
                        by_request[other] = by_request.get(other, 0) + n
            assert event[sc.LLM_STALL_PREFILL_TOKENS] == sum(by_request.values())
            expected = sorted(by_request.items(), key=lambda item: -item[1])[:3]
            assert list(zip(event[sc.LLM_STALL_REQUESTS], event[sc.LLM_STALL_REQUEST_TOKENS])) == expected
            named.update(event[sc.LLM_STALL_REQUESTS])
    # The chunks of both long prompts ran in decode steps (20 us a token: a 254-token chunk about 5 ms,
    # a decode step of two tokens well under 1 ms): each is named by some stall.
    assert named == {"l0", "l1"}


def expected_engine_time(run: dict[str, Any]) -> tuple[dict[str, float], dict[str, float], float]:
    """Per request, its engine seconds and its recompute seconds under the cost model (docs/lifecycle.md,
    "Engine time"), and the busy time, from vLLM's own account of each step: its ``num_scheduled_tokens``,
    what its ``Request`` says the tokens were, and the timestamp of its ``EngineCoreOutputs``. A step
    begins where its ``batch()`` call says; one with no outputs ends where the next one begins."""
    steps, calls = scheduled_steps(run), run["batch_calls"]
    recomputing = [{rid for rid, kind in s["kinds"].items() if kind == "recompute"} for s in steps]
    timed = zip(steps, calls, recomputing, strict=True)
    return shares([(s["scheduled"], c["ts"], s["outputs_ts"], again) for s, c, again in timed])


def test_each_requests_engine_time_is_its_share_of_vllms_steps(any_run: dict[str, Any]) -> None:
    total, recompute, busy = expected_engine_time(any_run)
    # By vLLM's internal id, the one its steps name (the client's differs for n > 1).
    found = {r["attributes"].get(sc.VLLM_REQUEST_ID, rid): r for rid, r in roots(any_run).items()}
    assert set(total) <= set(found)
    for rid, root in found.items():
        attributes = root["attributes"]
        assert attributes[sc.LLM_ENGINE_TIME] == pytest.approx(total.get(rid, 0.0), rel=1e-6, abs=1e-9), rid
        assert attributes[sc.LLM_ENGINE_TIME_RECOMPUTE] == pytest.approx(
            recompute.get(rid, 0.0), rel=1e-6, abs=1e-9
        ), rid
    # Every step's time went to its requests: the engine times sum to the busy time.
    assert sum(r["attributes"][sc.LLM_ENGINE_TIME] for r in found.values()) == pytest.approx(busy, rel=0.01)
