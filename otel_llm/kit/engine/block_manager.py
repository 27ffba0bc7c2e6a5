"""The paged KV cache's bookkeeping: a fixed pool of blocks, each sequence's block table, and the prefix
cache (full blocks found again by the hash of their tokens and of everything before them)."""

from __future__ import annotations

from collections import deque

from otel_llm.kit.engine.sequence import Sequence


class BlockManager:
    """Hands out KV blocks of ``block_size`` token slots from a pool of ``num_blocks``.

    A sequence's block table maps its token position p to slot
    ``block_table[p // block_size] * block_size + p % block_size`` of the flat KV tensors.

    Prefix caching (vLLM's automatic prefix caching, nano-vllm's layout): once a block is full its hash
    (of its tokens, chained with the previous block's hash) is registered. A freed block keeps its hash
    and contents until it is handed out again, so a later sequence with the same prefix, or a preempted
    one being recomputed, takes the block instead of recomputing it. Blocks in use by several sequences
    are counted, and return to the pool when the last one lets go.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.free_blocks: deque[int] = deque(range(num_blocks))  # oldest freed first: cached blocks last
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    @property
    def usage(self) -> float:
        """Fraction of the pool held by sequences (cached free blocks count as free), 0..1."""
        return self.num_used_blocks / self.num_blocks

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks ``seq`` needs to hold ``num_tokens`` tokens in total."""
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= len(self.free_blocks)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow ``seq``'s block table to hold ``num_tokens`` tokens. Call ``can_allocate`` first."""
        needed = self.blocks_needed(seq, num_tokens)
        if needed > len(self.free_blocks):
            raise RuntimeError(f"KV cache exhausted: {seq.request_id} needs {needed} blocks")
        for _ in range(needed):
            block = self.free_blocks.popleft()
            old = self.block_hash[block]
            if old is not None:  # its cached contents are overwritten from now on
                if self.hash_to_block.get(old) == block:
                    del self.hash_to_block[old]
                self.block_hash[block] = None
            self.ref_counts[block] = 1
            seq.block_table.append(block)

    def allocate_cached_prefix(self, seq: Sequence) -> int:
        """Give a sequence without blocks the cached blocks of its longest cached prefix; return how many
        of its tokens they hold (its K/V need no computing). At least one token is left to compute, so
        the step still yields the next token's logits."""
        if not self.enable_prefix_caching or seq.block_table:
            return 0
        bs = self.block_size
        tokens = seq.token_ids()
        seq.block_hashes.clear()
        prev = 0
        for i in range((len(tokens) - 1) // bs):
            h = hash((prev, *tokens[i * bs : (i + 1) * bs]))
            block = self.hash_to_block.get(h)
            if block is None:
                break
            if self.ref_counts[block] == 0:
                self.free_blocks.remove(block)
            self.ref_counts[block] += 1
            seq.block_table.append(block)
            seq.block_hashes.append(h)
            prev = h
        return len(seq.block_table) * bs

    def register_full_blocks(self, seq: Sequence) -> None:
        """Hash the blocks of ``seq`` that became full of computed tokens, so others can find them."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = min(seq.num_computed_tokens // bs, len(seq.block_table))
        if len(seq.block_hashes) >= full:
            return
        tokens = seq.token_ids()
        prev = seq.block_hashes[-1] if seq.block_hashes else 0
        for i in range(len(seq.block_hashes), full):
            h = hash((prev, *tokens[i * bs : (i + 1) * bs]))
            block = seq.block_table[i]
            if h not in self.hash_to_block:  # the same prefix computed twice at once: the first one wins
                self.hash_to_block[h] = block
                self.block_hash[block] = h
            seq.block_hashes.append(h)
            prev = h

    def free(self, seq: Sequence) -> None:
        """Let go of all of ``seq``'s blocks; a block returns to the pool (its contents still findable
        by hash until it is handed out again) when no sequence holds it."""
        for block in seq.block_table:
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_blocks.append(block)
        seq.block_table.clear()
        seq.block_hashes.clear()

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size
