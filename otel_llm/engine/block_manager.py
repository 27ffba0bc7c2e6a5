"""The paged KV cache's bookkeeping: a fixed pool of blocks and each sequence's block table."""

from __future__ import annotations

from collections import deque

from otel_llm.engine.sequence import Sequence


class BlockManager:
    """Hands out KV blocks of ``block_size`` token slots from a pool of ``num_blocks``.

    A sequence's block table maps its token position p to slot
    ``block_table[p // block_size] * block_size + p % block_size`` of the flat KV tensors.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

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
            seq.block_table.append(self.free_blocks.popleft())

    def free(self, seq: Sequence) -> None:
        """Return all of ``seq``'s blocks to the pool; its cached K/V are gone."""
        self.free_blocks.extend(seq.block_table)
        seq.block_table.clear()

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size
