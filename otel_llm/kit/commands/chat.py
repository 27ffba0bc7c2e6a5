"""The demo's chat traffic: what a chat service's requests look like to its engine's prefix cache.

Every request starts with one shared system prompt. Most are single questions; a few are conversations
whose next turn arrives a few engine steps after the previous answer finished, carrying the history
(the previous prompt and the answer's own token ids) plus the new message, as a chat client resends
it. So most requests find the system prompt, and a follow-up its whole history, in the prefix cache
(``gen_ai.usage.cache_read.input_tokens``), and a preempted request finds part of its context there
when it is rescheduled (``llm.recompute.cached_tokens``).

Arrivals are counted in engine steps, so a seed gives the same run on any machine. Lengths are tokens
of the byte tokenizer (one per byte).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

# 96 bytes: six full 16-token KV blocks that every prompt shares.
SYSTEM_PROMPT = (
    "System: you are the otel-llm demo assistant. Answer in short plain sentences; say so if unsure.\n"
)
MIN_ROOM = 64  # tokens a sequence must hold beyond the system prompt for the workload to use it
_USER = "\nUser: "  # before each message (the first without its newline)
TURNS = 3  # turns of each conversation
REQUESTS_PER_CONVERSATION = 8  # one conversation per this many requests of the workload


def system_prompt(max_len: int) -> str:
    """The shared system prompt, or none when a sequence of ``max_len`` tokens (a tiny KV cache) would
    keep too little room beside it for a question and its answer."""
    return SYSTEM_PROMPT if max_len - len(SYSTEM_PROMPT) >= MIN_ROOM else ""


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One request of the workload: a single question, or one turn of a conversation.

    ``arrival_step``: the engine step it arrives at; for a later turn (``follows`` is the index of the
    previous turn) the number of steps after the previous turn finished."""

    arrival_step: int
    text: str  # the new message (after the history, for a later turn)
    max_tokens: int
    follows: int | None = None


def make_chat_workload(
    n: int, seed: int, max_len: int, question: Callable[[random.Random, int], str]
) -> list[ChatRequest]:
    """``n`` requests: one conversation of 3 turns per 8 requests, the rest single questions, in
    arrival order (a conversation's later turns right after its first). ``question(rng, room)`` writes
    a message of at most ``room`` tokens; ``max_len`` bounds a first turn's prompt + output."""
    rng = random.Random(seed)
    conversations = n // REQUESTS_PER_CONVERSATION
    leads = n - conversations * (TURNS - 1)  # single questions and first turns: they arrive on their own
    starts = set(rng.sample(range(leads), conversations))
    room = max_len - len(system_prompt(max_len)) - len(_USER)
    out: list[ChatRequest] = []
    step = 0
    for k in range(leads):
        step += rng.choice((0, 1, 2, 4, 8))
        max_tokens = rng.randint(min(8, room // 2), min(48, room // 2))
        out.append(ChatRequest(step, question(rng, room - max_tokens), max_tokens))
        if k in starts:
            for _ in range(TURNS - 1):  # each a few steps after the previous answer, as a person replies
                max_tokens = rng.randint(min(8, room // 2), min(24, room // 2))
                text = question(rng, min(48, room - max_tokens))
                out.append(ChatRequest(rng.choice((2, 4, 8)), text, max_tokens, len(out) - 1))
    return out


class ChatClient:
    """Hands the workload to an engine step by step: each arrival's prompt token ids, a later turn's
    once its previous turn finished (the history, the answer's token ids, the new message). A later
    turn whose history no longer fits ``max_len`` starts over from the system prompt, as a client that
    trims its history would."""

    def __init__(self, workload: list[ChatRequest], encode: Callable[[str], list[int]], max_len: int) -> None:
        self._workload = workload
        self._encode = encode
        self._max_len = max_len
        self._system = system_prompt(max_len)
        # (arrival step, index) of the requests that can arrive: single questions and first turns now,
        # later turns once their previous turn finished.
        self._due = [(r.arrival_step, i) for i, r in enumerate(workload) if r.follows is None]
        self._follow_up = {r.follows: i for i, r in enumerate(workload) if r.follows is not None}
        self._context: dict[int, list[int]] = {}  # prompt + answer so far, of requests with a follow-up
        self._left = len(workload)

    @staticmethod
    def request_id(index: int) -> str:
        return f"req-{index:03d}"

    @property
    def done(self) -> bool:
        """Every request of the workload was handed out."""
        return self._left == 0

    def next_arrival(self) -> int | None:
        """The step of the next arrival known now (None while only later turns are pending)."""
        return min(self._due)[0] if self._due else None

    def arrivals(self, step: int) -> list[tuple[str, list[int], int]]:
        """(request id, prompt token ids, max tokens) of every request arriving at or before ``step``."""
        ready = sorted(d for d in self._due if d[0] <= step)
        self._due = [d for d in self._due if d[0] > step]
        out = []
        for _, i in ready:
            req = self._workload[i]
            history = self._context.pop(req.follows, None) if req.follows is not None else None
            prompt = history + self._encode(_USER + req.text) if history else []
            if not prompt or len(prompt) + req.max_tokens > self._max_len:  # none, or trimmed away
                prompt = self._encode(self._system + _USER[1:] + req.text)
            if i in self._follow_up:
                self._context[i] = list(prompt)
            out.append((self.request_id(i), prompt, req.max_tokens))
            self._left -= 1
        return out

    def delivered(self, request_id: str, token_ids: list[int], finished: bool, step: int) -> None:
        """An engine output: the answer grows; a finished turn lets its follow-up arrive later."""
        i = int(request_id.rsplit("-", 1)[1])
        if i in self._context:
            self._context[i] += token_ids
        if finished and i in self._follow_up:
            nxt = self._follow_up[i]
            self._due.append((step + self._workload[nxt].arrival_step, nxt))
