"""The demo's traffic: prompts of words from the field, arriving by engine step, so that a seed gives the
same workload on any machine; shared by ``otel-llm demo`` and its ``--disaggregated`` form."""

from __future__ import annotations

import random
from dataclasses import dataclass

_WORDS = (
    "token", "cache", "block", "prefill", "decode", "queue", "batch", "stream", "attention", "layer",
    "paged", "request", "engine", "model", "latency", "trace", "span", "metric", "schedule", "preempt",
    "recompute", "tensor", "kernel", "memory",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class DemoRequest:
    arrival_step: int  # the engine step at which the request arrives
    prompt: str
    max_tokens: int


def make_workload(n: int, seed: int, max_len: int) -> list[DemoRequest]:
    """Mostly short prompts, some long ones (chunked prefill), outputs of 8 to 64 tokens."""
    rng = random.Random(seed)
    step, out = 0, []
    for _ in range(n):
        step += rng.choice((0, 1, 2, 4, 8))
        max_tokens = rng.randint(min(8, max_len // 2), min(64, max_len // 2))
        room = max_len - max_tokens  # prompt tokens that still fit one sequence (a tiny cache: few)
        target = rng.randint(min(150, room), room) if rng.random() < 0.2 else rng.randint(10, 120)
        words: list[str] = []
        while len(" ".join(words)) < target:
            words.append(rng.choice(_WORDS))
        prompt = " ".join(words)[: max(1, min(target, max_len - max_tokens))]
        out.append(DemoRequest(step, prompt, max_tokens))
    return out


def chat_question(rng: random.Random, room: int) -> str:
    """A message of at most ``room`` tokens: mostly 10 to 120, one in five longer (chunked prefill)."""
    room = max(1, room)
    if rng.random() < 0.2:
        target = rng.randint(min(150, room), room)
    else:
        target = rng.randint(min(10, room), min(120, room))
    words: list[str] = []
    while len(" ".join(words)) < target:
        words.append(rng.choice(_WORDS))
    return " ".join(words)[:target]
