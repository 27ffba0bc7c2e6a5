"""A tiny decoder-only transformer whose attention reads and writes K/V through block tables.

Tokens of all sequences in a step are packed flat (N tokens); linear layers run on the packed tokens
and only attention pads them per sequence. Shapes in comments: N packed tokens, B sequences, Tq the
longest chunk in the step, Tc the longest context, H heads, D head size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from otel_llm.kit.engine.config import ModelConfig


@dataclass(slots=True)
class AttentionMetadata:
    """Where the step's tokens go in the KV cache and what each of them may attend to."""

    slot_mapping: torch.Tensor  # (N,) cache slot of each new token
    kv_slots: torch.Tensor  # (B, Tc) cache slots of each sequence's context, padded with slot 0
    query_valid: torch.Tensor  # (B, Tq) True where a padded query position holds a real token
    mask: torch.Tensor  # (B, 1, Tq, Tc) True where the query may attend to the key (causal, unpadded)


class PagedAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.n_heads, self.head_dim).unbind(1)  # each (N, H, D)
        k_cache, v_cache = kv_cache.unbind(0)  # each (slots, H, D), views into the pool
        k_cache[meta.slot_mapping] = k
        v_cache[meta.slot_mapping] = v
        b, tq = meta.query_valid.shape
        q_pad = q.new_zeros(b, tq, self.n_heads, self.head_dim)
        q_pad[meta.query_valid] = q
        keys = k_cache[meta.kv_slots].transpose(1, 2)  # (B, H, Tc, D)
        values = v_cache[meta.kv_slots].transpose(1, 2)
        out = F.scaled_dot_product_attention(q_pad.transpose(1, 2), keys, values, attn_mask=meta.mask)
        out = out.transpose(1, 2)[meta.query_valid]  # (N, H, D), back in packed order
        return self.proj(out.reshape(n, -1))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = PagedAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), kv_cache, meta)
        return x + self.mlp(self.ln_2(x))


class TinyTransformer(nn.Module):
    """GPT-style model with random weights. Same seed, same weights, on any device."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        with torch.random.fork_rng(devices=[]):  # seed the weights without touching the caller's RNG
            torch.manual_seed(cfg.seed)
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.pos_emb = nn.Embedding(cfg.max_position, cfg.d_model)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
            self.ln_f = nn.LayerNorm(cfg.d_model)
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def kv_cache_shape(self, num_slots: int) -> tuple[int, ...]:
        """(layers, K/V, slots, H, D): one flat pool of token slots per layer, split into blocks by index."""
        cfg = self.cfg
        return (cfg.n_layers, 2, num_slots, cfg.n_heads, cfg.d_model // cfg.n_heads)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # (N,)
        positions: torch.Tensor,  # (N,)
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        logits_index: torch.Tensor,  # (S,) packed indices of the tokens whose next token is wanted
    ) -> torch.Tensor:
        x = self.tok_emb(input_ids) + self.pos_emb(positions)  # (N, d_model)
        for layer, block in enumerate(self.blocks):
            x = block(x, kv_cache[layer], meta)
        return self.lm_head(self.ln_f(x[logits_index]))  # (S, vocab)
