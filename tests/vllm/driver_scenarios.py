"""The scenarios drive_scheduler.py runs through vLLM's scheduler: requests, KV cache and token budget.

Plain data, no vLLM imports. Blocks hold 16 tokens; block counts include the one block vLLM's block pool
keeps back (its null block), so ``num_blocks=5`` leaves 4 for requests. vLLM's scheduling does not
depend on timing, so each scenario produces the same engine-core event sequence on every run.

- ``mixed``: four requests on 5 usable blocks; r1 and r2 are preempted after their first tokens, r2 stops
  on a stop token, r0 and r1 run to their length, r3 is aborted while it waits, r1 has a W3C parent.
- ``prefill_preemption``: chunked prefill, 16 tokens a step, on 4 usable blocks. vLLM admits p1 (a
  48-token prompt) only while its whole prompt fits, but allocates blocks chunk by chunk; at step 3 p0,
  ahead of it and decoding, crosses into a new block and takes the last free one, so p1 (32 of 48 prompt
  tokens computed) cannot get its next block and is preempted before its first token. vLLM's sequence
  for p1: QUEUED, SCHEDULED, PREEMPTED, SCHEDULED (after p0 finished), TOKENS, TOKENS, TOKENS.
- ``speculative``: vLLM's ngram speculative decoding, 2 draft tokens a step; the made-up model accepts
  both drafts of s0 (3 tokens a step) and one of s1 (2 a step), so outputs carry several tokens.
- ``stall``: chunked prefill (256 tokens a step), and a model step that takes 20 µs per scheduled token
  (the driver sleeps, standing in for the model's compute). Two requests decode; at step 6 a 480-token
  prompt (l0) arrives, at step 20 a 400-token one (l1), and their chunks share the decode requests'
  steps, so those requests' tokens wait about 5 ms each while a chunk runs: stalls caused by prefill,
  naming l0 and l1.
- ``recompute``: prefix caching on, prompts sharing their first 16 tokens, chunked prefill (16 tokens a
  step) on 8 usable blocks. vLLM preempts q3 after its first token and re-admits it with the shared
  block cached (16 tokens) and 49 to recompute; three steps into that recompute (45 tokens fed) it
  preempts q3 again, and re-admits it with the blocks the cut recompute had just filled found cached
  (48 tokens) and 17 left. The reschedulings' figures are compared with vLLM's own numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STOP_TOKEN, OTHER_TOKEN = 99, 42  # the made-up model's tokens


@dataclass(frozen=True)
class RequestSpec:
    """One request: prompt length and max_tokens in tokens."""

    prompt_len: int
    max_tokens: int
    stop_at: int | None = None  # output index at which the made-up model emits the stop token
    accepted: int = 0  # draft tokens the made-up model accepts per decode step (speculative decoding)
    arrive_step: int = 0  # the engine step at which the request is added (0: before the first)


@dataclass(frozen=True)
class Scenario:
    """One run: the KV cache, the step token budget and the requests, all added at the start."""

    name: str
    num_blocks: int  # KV cache blocks, the null block included
    max_num_batched_tokens: int  # the token budget of one engine step (chunked prefill below a prompt)
    requests: dict[str, RequestSpec] = field(default_factory=dict)
    aborted: str | None = None  # the client goes away while it waits: finish reason abort
    abort_at_step: int = -1
    parented: str | None = None  # carries a W3C traceparent in its trace headers
    num_speculative_tokens: int = 0  # draft tokens proposed per decode step (vLLM's ngram method)
    prefix_caching: bool = False  # vLLM's automatic prefix caching
    shared_prefix: int = 0  # leading prompt tokens every request of the scenario has in common
    seconds_per_token: float = 0.0  # the made-up model step's time per scheduled token (0: no wait)


SCENARIOS = (
    Scenario(
        "mixed",
        num_blocks=6,
        max_num_batched_tokens=256,
        requests={
            "r0": RequestSpec(30, 5),
            "r1": RequestSpec(30, 20),
            "r2": RequestSpec(30, 20, 7),
            "r3": RequestSpec(30, 20),
        },
        aborted="r3",
        abort_at_step=2,
        parented="r1",
    ),
    Scenario(
        "prefill_preemption",
        num_blocks=5,
        max_num_batched_tokens=16,
        requests={"p0": RequestSpec(14, 20), "p1": RequestSpec(48, 3)},
    ),
    Scenario(
        "speculative",
        num_blocks=16,
        max_num_batched_tokens=256,
        requests={"s0": RequestSpec(20, 11, accepted=2), "s1": RequestSpec(20, 9, stop_at=5, accepted=1)},
        num_speculative_tokens=2,
    ),
    Scenario(
        "recompute",
        num_blocks=9,
        max_num_batched_tokens=16,
        requests={
            "q0": RequestSpec(14, 40),
            "q1": RequestSpec(64, 3),
            "q2": RequestSpec(30, 40),
            "q3": RequestSpec(64, 20),
            "q4": RequestSpec(30, 3),
        },
        prefix_caching=True,
        shared_prefix=16,
    ),
    Scenario(
        "stall",
        num_blocks=128,
        max_num_batched_tokens=256,
        requests={
            "t0": RequestSpec(20, 60),
            "t1": RequestSpec(20, 60),
            "l0": RequestSpec(480, 4, arrive_step=6),
            "l1": RequestSpec(400, 4, arrive_step=20),
        },
        seconds_per_token=20e-6,
    ),
    Scenario(
        "steady",  # a decode batch that stays the same for many steps: the tracker's steady path
        num_blocks=32,
        max_num_batched_tokens=256,
        requests={f"d{i}": RequestSpec(20, 32) for i in range(6)},
    ),
)
