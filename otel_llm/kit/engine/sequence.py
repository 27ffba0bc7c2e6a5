"""One request inside the engine: its tokens, how many of them are in the KV cache, and its blocks."""

from __future__ import annotations

from enum import Enum, auto


class SequenceStatus(Enum):
    WAITING = auto()  # in the waiting queue: never scheduled, or preempted and waiting to recompute
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    """A request's token state.

    ``num_computed_tokens`` counts the tokens whose K/V are in the cache. Preemption resets it to 0,
    so the next schedule recomputes prompt + produced tokens (vLLM V1 recompute preemption).
    """

    __slots__ = (
        "block_hashes",
        "block_table",
        "cached_at_admission",
        "finish_reason",
        "max_tokens",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_preemptions",
        "output_token_ids",
        "pending_kv",
        "prompt_token_ids",
        "request_id",
        "status",
        "stop_token_ids",
        "trace_link",
        "undelivered",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        stop_token_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.output_token_ids: list[int] = []
        self.max_tokens = max_tokens
        self.stop_token_ids = stop_token_ids
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # prefix-cache hashes of its leading full blocks
        # Prompt tokens found in the prefix cache when first scheduled (None until then).
        self.num_cached_tokens: int | None = None
        # Tokens found in the prefix cache at its latest admission, the first or one after a preemption
        # (then the rest of prompt + output is recomputed); 0 for a request handed in with its K/V.
        self.cached_at_admission = 0
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        self.trace_link: object | None = None  # SpanContext of the request span, for step-span links
        # A request handed in by a prefill instance: its prompt's K/V, written into its blocks when it is
        # first scheduled, and its first token (produced there), delivered with the next one.
        self.pending_kv: object | None = None
        self.undelivered = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to feed the model: the prompt (or its rest), everything after a preemption, or 1."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """True until every known token except the newest is in the cache (prompt or recompute pending)."""
        return self.num_uncomputed_tokens > 1 or not self.output_token_ids

    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.name}, prompt={self.num_prompt_tokens}, "
            f"out={self.num_output_tokens}/{self.max_tokens}, computed={self.num_computed_tokens})"
        )
