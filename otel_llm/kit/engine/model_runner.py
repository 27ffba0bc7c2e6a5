"""Turns a scheduled batch into model inputs, runs the forward pass and samples greedily."""

from __future__ import annotations

import time

import torch

from otel_llm.kit.engine.block_manager import BlockManager
from otel_llm.kit.engine.config import EngineConfig
from otel_llm.kit.engine.model import AttentionMetadata, TinyTransformer
from otel_llm.kit.engine.scheduler import ScheduledBatch
from otel_llm.kit.engine.sequence import Sequence


def resolve_device(name: str) -> torch.device:
    """``cpu``, or ``cuda[:N]`` when a GPU is present; asking for CUDA without one fails early."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but torch sees no CUDA GPU; use device='cpu'")
    return device


class ModelRunner:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.device = resolve_device(config.device)
        self.block_manager = block_manager
        self.model = TinyTransformer(config.model).to(self.device).eval()
        with torch.inference_mode():
            self.kv_cache = torch.zeros(self.model.kv_cache_shape(config.kv_capacity), device=self.device)
        # Random weights emit arbitrary bytes; limiting sampling to printable ASCII keeps the text readable.
        self.sample_bias = torch.zeros(config.model.vocab_size, device=self.device)
        if config.printable_only:
            self.sample_bias[:32] = self.sample_bias[127:] = float("-inf")
        self.last_forward_s = 0.0  # seconds the last forward pass took (CUDA events on GPU)

    def run(self, batch: ScheduledBatch) -> list[int | None]:
        """Feed each sequence its new tokens; return its next token, or None for an unfinished chunk."""
        input_ids: list[int] = []
        positions: list[int] = []
        logits_index: list[int] = []
        samples: list[bool] = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            start = seq.num_computed_tokens
            input_ids += seq.token_ids()[start : start + n]
            positions += range(start, start + n)
            logits_index.append(len(input_ids) - 1)
            # Only a chunk that reaches the newest token yields a token; earlier prefill chunks do not.
            samples.append(start + n == seq.num_tokens)
        meta = self._metadata(batch)
        dev = self.device
        started = self._start_timer()
        logits = self.model(
            torch.tensor(input_ids, device=dev),
            torch.tensor(positions, device=dev),
            self.kv_cache,
            meta,
            torch.tensor(logits_index, device=dev),
        )
        # Greedy, so a recompute after preemption yields exactly the tokens it would have without one.
        next_ids = (logits + self.sample_bias).argmax(dim=-1).tolist()
        self.last_forward_s = self._stop_timer(started)
        return [tok if sample else None for tok, sample in zip(next_ids, samples, strict=True)]

    def read_kv(self, seq: Sequence, num_tokens: int) -> torch.Tensor:
        """A copy on the CPU of ``seq``'s K/V for its first ``num_tokens`` positions:
        (layers, K/V, num_tokens, H, D), float32, contiguous (what a KV transfer sends)."""
        slots = self._slots(seq, num_tokens)
        return self.kv_cache[:, :, slots].to("cpu", copy=True).contiguous()

    def write_kv(self, seq: Sequence, kv: torch.Tensor) -> None:
        """Put K/V read by ``read_kv`` (on another instance) into ``seq``'s blocks, positions 0..n-1."""
        slots = self._slots(seq, kv.shape[2])
        with torch.inference_mode():
            self.kv_cache[:, :, slots] = kv.to(self.device)

    def _slots(self, seq: Sequence, num_tokens: int) -> torch.Tensor:
        bs = self.block_manager.block_size
        blocks = torch.tensor(seq.block_table, dtype=torch.long)
        return (blocks[:, None] * bs + torch.arange(bs)).flatten()[:num_tokens].to(self.device)

    def _metadata(self, batch: ScheduledBatch) -> AttentionMetadata:
        bs = self.block_manager.block_size
        seqs, counts = batch.seqs, batch.num_new_tokens
        ctx_lens = [s.num_computed_tokens + n for s, n in zip(seqs, counts, strict=True)]
        tq, tc = max(counts), max(ctx_lens)
        kv_slots = torch.zeros(len(seqs), tc, dtype=torch.long)
        query_valid = torch.zeros(len(seqs), tq, dtype=torch.bool)
        # Query row i of sequence b sits at position ctx_len - n + i and sees keys 0..that position.
        q_pos = torch.zeros(len(seqs), tq, dtype=torch.long)
        for b, (seq, n, ctx) in enumerate(zip(seqs, counts, ctx_lens, strict=True)):
            blocks = torch.tensor(seq.block_table, dtype=torch.long)
            kv_slots[b, :ctx] = (blocks[:, None] * bs + torch.arange(bs)).flatten()[:ctx]
            query_valid[b, :n] = True
            q_pos[b, :n] = torch.arange(ctx - n, ctx)
        mask = torch.arange(tc)[None, None, :] <= q_pos[:, :, None]  # (B, Tq, Tc)
        slot_mapping = torch.cat(
            [kv_slots[b, ctx - n : ctx] for b, (n, ctx) in enumerate(zip(counts, ctx_lens, strict=True))]
        )
        dev = self.device
        return AttentionMetadata(
            slot_mapping=slot_mapping.to(dev),
            kv_slots=kv_slots.to(dev),
            query_valid=query_valid.to(dev),
            mask=mask[:, None].to(dev),
        )

    def _start_timer(self) -> object:
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            return (start, end)
        return time.monotonic()

    def _stop_timer(self, started: object) -> float:
        if isinstance(started, tuple):
            start, end = started
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        return time.monotonic() - started  # type: ignore[operator]
