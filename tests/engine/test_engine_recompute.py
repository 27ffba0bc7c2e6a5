"""Preemption loses nothing: with greedy decoding, recomputing prompt + produced tokens gives the same
tokens as a run on a cache large enough never to preempt. Also through the asyncio streaming API."""

from __future__ import annotations

import asyncio

from engine_tools import run_to_completion, spy_scheduler, tiny_engine

from otel_llm.kit.engine import AsyncLLMEngine, EngineConfig, LLMEngine

PROMPTS = [("hello world", 20), ("a" * 13, 19), ("paged attention", 12), ("b" * 24, 6), ("kv", 25)]


def _run(engine: LLMEngine) -> dict[str, list[int]]:
    for prompt, max_tokens in PROMPTS:
        engine.add_request(prompt, max_tokens=max_tokens)
    return {rid: tokens for rid, (tokens, _) in run_to_completion(engine).items()}


def test_recompute_after_preemption_reproduces_the_unpreempted_tokens() -> None:
    roomy = LLMEngine(EngineConfig(num_kv_blocks=64, block_size=4))
    reference = _run(roomy)
    assert roomy.num_preemptions == 0

    tight = tiny_engine()
    log = spy_scheduler(tight)
    preempted_run = _run(tight)

    assert any(produced > 0 for _, produced in log.preemptions), "the tight run must preempt during decode"
    assert any(produced == 0 for _, produced in log.preemptions), "... and during prefill"
    assert preempted_run == reference


def test_same_seed_same_weights_other_seed_other_tokens() -> None:
    a = LLMEngine(EngineConfig()).generate(["same seed"], max_tokens=8)
    b = LLMEngine(EngineConfig()).generate(["same seed"], max_tokens=8)
    c = LLMEngine(EngineConfig(model=EngineConfig().model.__class__(seed=1))).generate(
        ["same seed"], max_tokens=8
    )
    assert a == b and a != c


def test_streams_match_generate_and_leaving_early_aborts() -> None:
    prompts = ["stream one", "stream two, a little longer", "three"]
    expected = LLMEngine(EngineConfig(num_kv_blocks=64, block_size=4)).generate(prompts, max_tokens=10)
    engine = tiny_engine()

    async def main() -> tuple[list[str], int]:
        front = AsyncLLMEngine(engine)

        async def collect(prompt: str) -> str:
            return "".join([piece async for piece in front.stream(prompt, max_tokens=10)])

        texts = await asyncio.gather(*(collect(p) for p in prompts))
        pieces = front.stream("abandoned", max_tokens=30)
        await pieces.__anext__()
        await pieces.aclose()  # the consumer goes away after one piece: the request is aborted
        while engine.has_unfinished():
            await asyncio.sleep(0.01)
        await front.aclose()
        return list(texts), engine.scheduler.block_manager.num_free_blocks

    texts, free = asyncio.run(main())
    assert texts == expected
    assert free == engine.scheduler.block_manager.num_blocks
