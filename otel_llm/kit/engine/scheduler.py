"""Continuous-batching scheduler with vLLM V1's recompute preemption.

Each step has a token budget shared by prefill chunks and decodes. Running sequences are served first,
in admission order; when one needs a KV block and the pool is empty, the most recently admitted
running sequence is preempted (its blocks freed, itself pushed to the front of the waiting queue) until
the block fits, possibly preempting the needy sequence itself. Waiting sequences are admitted only in
steps without preemption, so a freshly evicted sequence is not re-admitted into the same shortage.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from otel_llm.kit.engine.block_manager import BlockManager
from otel_llm.kit.engine.config import EngineConfig
from otel_llm.kit.engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledBatch:
    """What one step runs: each sequence with the number of its tokens to feed the model."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    newly_scheduled: list[Sequence] = field(default_factory=list)  # first time, or resumed after preemption
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def is_empty(self) -> bool:
        return not self.seqs


class Scheduler:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.block_manager = BlockManager(
            config.num_kv_blocks, config.block_size, config.enable_prefix_caching
        )
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last one is the next to preempt
        self.num_preemptions = 0
        # Prefix cache since start, in tokens: looked up at admission, and found cached.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        # Prompt tokens of requests admitted for the first time, by where their K/V came from: computed
        # by the model, found in the prefix cache, or handed in with the request (vLLM's split of
        # vllm:prompt_tokens_by_source). Readmissions after a preemption are recomputes, not counted.
        self.prompt_tokens_computed = 0
        self.prompt_tokens_cached = 0
        self.prompt_tokens_transferred = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._chunk(seq, budget)
            while not self.block_manager.can_allocate(seq, seq.num_computed_tokens + n):
                victim = self.running.pop()
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break  # seq preempted itself; everything after it was preempted before it
            self.block_manager.allocate(seq, seq.num_computed_tokens + n)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            budget -= n
            i += 1

        if batch.preempted:
            return batch
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            # A request handed in with its prompt's K/V (disaggregated decode) brings its computed tokens;
            # any other looks its prompt up in the prefix cache.
            handed_in = seq.pending_kv is not None
            cached = 0 if handed_in else self.block_manager.allocate_cached_prefix(seq)
            if not handed_in:
                seq.num_computed_tokens = cached
            n = self._chunk(seq, budget)
            # A preempted sequence comes back only when its whole context (prompt + tokens so far) fits:
            # re-admitting it for one chunk would evict it again a step later, over and over.
            # A handed-in request needs blocks for all of its prompt's K/V at once, too.
            need = seq.num_tokens if seq.num_preemptions else seq.num_computed_tokens + n
            if not self.block_manager.can_allocate(seq, need):
                self.block_manager.free(seq)  # the cached blocks wait with it
                if not handed_in:
                    seq.num_computed_tokens = 0
                break  # first come, first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            if not handed_in:
                self.prefix_cache_queries += seq.num_tokens
                self.prefix_cache_hits += cached
                if seq.num_cached_tokens is None:
                    seq.num_cached_tokens = cached
            seq.cached_at_admission = cached
            if not seq.num_preemptions:  # its first admission
                self._count_prompt(seq, cached, handed_in)
            self.block_manager.allocate(seq, seq.num_computed_tokens + n)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            batch.newly_scheduled.append(seq)
            budget -= n
        return batch

    def _count_prompt(self, seq: Sequence, cached: int, handed_in: bool) -> None:
        """A first admission's prompt tokens, by source (tokens)."""
        if handed_in:
            self.prompt_tokens_transferred += seq.num_prompt_tokens
        else:
            self.prompt_tokens_cached += cached
            self.prompt_tokens_computed += seq.num_prompt_tokens - cached

    def _chunk(self, seq: Sequence, budget: int) -> int:
        """Tokens of ``seq`` to feed this step: what is left, within the budget and the prefill cap."""
        n = min(seq.num_uncomputed_tokens, budget)
        cap = self.config.long_prefill_token_threshold
        return min(n, cap) if cap > 0 else n

    def _preempt(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0  # recompute prompt + produced tokens when rescheduled
        self.block_manager.free(seq)
        self.waiting.appendleft(seq)
        seq.num_preemptions += 1
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take ``seq`` out of the queue or the batch for good and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.block_manager.free(seq)
