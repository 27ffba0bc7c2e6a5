"""The scheduler under a tiny KV cache: it preempts in decode and in prefill, yet every request ends
with exactly max_tokens tokens and every block comes back."""

from __future__ import annotations

import pytest
import torch
from engine_tools import run_to_completion, spy_scheduler, tiny_engine

from otel_llm.kit.engine import EngineConfig, LLMEngine


def test_decode_preemption_completes_every_request_and_frees_every_block() -> None:
    engine = tiny_engine()
    log = spy_scheduler(engine)
    wanted = {
        engine.add_request(p, max_tokens=n): n for p, n in [("hi", 20), ("yo!", 18), ("abc", 15), ("q", 9)]
    }

    out = run_to_completion(engine)

    assert any(produced > 0 for _, produced in log.preemptions), "expected a preemption during decode"
    assert {rid: len(tokens) for rid, (tokens, _) in out.items()} == wanted
    assert {reason for _, reason in out.values()} == {"length"}
    bm = engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert sorted(bm.free_blocks) == list(range(bm.num_blocks))  # each block exactly once
    assert engine.num_preemptions == len(log.preemptions)


def test_long_prompt_is_preempted_during_its_chunked_prefill() -> None:
    engine = tiny_engine()
    log = spy_scheduler(engine)
    first = engine.add_request("a" * 13, max_tokens=19)  # 32 tokens: 8 of the 10 blocks at the end
    early = engine.step() + engine.step()  # its prompt takes two 8-token chunks; the second yields a token
    second = engine.add_request("b" * 24, max_tokens=2)  # prefilled in chunks while the first grows

    out = run_to_completion(engine)

    assert (second, 0) in log.preemptions, "expected the long prompt to be preempted before its first token"
    assert len(early) + len(out[first][0]) == 19 and len(out[second][0]) == 2
    assert engine.scheduler.block_manager.num_free_blocks == 10


def test_one_step_mixes_prefill_chunks_and_decodes_within_the_budget() -> None:
    engine = tiny_engine(num_kv_blocks=40, max_num_batched_tokens=16)
    log = spy_scheduler(engine)
    engine.add_request("short", max_tokens=6)
    engine.step()
    engine.add_request("a much longer prompt than the budget", max_tokens=3)
    run_to_completion(engine)

    assert all(sum(n for _, n, _ in step) <= 16 for step in log.steps)
    assert any({prefill for _, _, prefill in step} == {True, False} for step in log.steps)
    chunks = [n for step in log.steps for rid, n, prefill in step if rid == "req-1" and prefill]
    assert len(chunks) > 1, "a prompt longer than the budget is prefilled in chunks"


def test_stop_token_and_abort_finish_requests_early() -> None:
    reference = run_to_completion(_engine_with("hello there", max_tokens=12))["req-0"][0]
    stop = reference[4]
    engine = LLMEngine(EngineConfig(num_kv_blocks=16, block_size=4))
    rid = engine.add_request("hello there", max_tokens=12, stop_token_ids=[stop])
    tokens, reason = run_to_completion(engine)[rid]
    assert reason == "stop"
    assert tokens == reference[: reference.index(stop) + 1]

    engine = LLMEngine(EngineConfig(num_kv_blocks=16, block_size=4, max_num_seqs=1))
    engine.add_request("running", max_tokens=50, request_id="run")
    engine.add_request("waiting", max_tokens=5, request_id="wait")  # one sequence at a time: it waits
    engine.step()
    assert engine.scheduler.block_manager.num_free_blocks < 16 and len(engine.scheduler.waiting) == 1
    assert engine.abort_request("run") and engine.abort_request("wait")
    assert not engine.abort_request("run"), "a second abort finds nothing"
    assert not engine.has_unfinished()
    assert engine.scheduler.block_manager.num_free_blocks == 16


def _engine_with(prompt: str, max_tokens: int) -> LLMEngine:
    engine = LLMEngine(EngineConfig(num_kv_blocks=16, block_size=4))
    engine.add_request(prompt, max_tokens=max_tokens)
    return engine


def test_requests_that_can_never_run_fail_early_with_a_hint() -> None:
    engine = tiny_engine()
    with pytest.raises(ValueError, match="num_kv_blocks"):
        engine.add_request("x" * 30, max_tokens=20)  # 50 tokens > 40 slots
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("", max_tokens=4)
    engine.add_request("x", request_id="dup")
    with pytest.raises(ValueError, match="unique"):
        engine.add_request("x", request_id="dup")
    with pytest.raises(ValueError, match="device"):
        EngineConfig(device="tpu")


def test_cuda_is_used_only_when_present() -> None:
    if torch.cuda.is_available():
        engine = LLMEngine(EngineConfig(device="cuda"))
        assert engine.generate(["on the gpu"], max_tokens=3)[0]
    else:
        with pytest.raises(ValueError, match="no CUDA"):
            LLMEngine(EngineConfig(device="cuda"))
