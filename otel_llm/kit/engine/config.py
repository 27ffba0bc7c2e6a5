"""Engine and model configuration: one frozen dataclass each, defaults sized for a 2-core CPU demo."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape of the tiny decoder-only transformer. Weights are random, drawn from ``seed``."""

    vocab_size: int = 256  # byte-level tokenizer: one token per byte
    d_model: int = 64  # small enough that a step takes a millisecond or two on CPU
    n_layers: int = 2
    n_heads: int = 4
    max_position: int = 2048  # learned position table; bounds prompt + output length
    seed: int = 0

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_position"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Scheduler and KV-cache sizes.

    ``num_kv_blocks * block_size`` token slots are shared by all running sequences; a pool smaller
    than the sum of their needs is what makes the scheduler preempt.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    num_kv_blocks: int = 64
    block_size: int = 16  # token slots per KV block, as in vLLM
    max_num_batched_tokens: int = 128  # per-step token budget shared by prefill chunks and decodes
    max_num_seqs: int = 16  # most sequences in one step
    # Most tokens of one sequence's prefill per step (vLLM's long_prefill_token_threshold; 0: no cap).
    # A cap lets several long prompts prefill side by side, each growing its KV cache every step.
    long_prefill_token_threshold: int = 0
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N"; "cuda" fails early when no GPU is present
    printable_only: bool = True  # sample only bytes 32..126, so random weights still print as text
    enable_prefix_caching: bool = True  # reuse the KV blocks of a prefix seen before, as vLLM does
    step_spans: bool = False  # emit one llm.engine.step span per step (off: a span per step costs ~13 us)
    # Report each step's batch to the tracker (RequestTracker.batch: its requests' stalls explained).
    report_batches: bool = True
    # Disaggregated serving: "prefill" hands each request off after its first token (take_handoffs()),
    # "decode" continues handed-off requests (add_handoff()), "both" serves whole requests.
    role: str = "both"

    def __post_init__(self) -> None:
        for name in ("num_kv_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.printable_only and self.model.vocab_size < 127:
            raise ValueError("printable_only needs vocab_size >= 127 (byte tokens); set printable_only=False")
        if self.role not in ("prefill", "decode", "both"):
            raise ValueError(f"role must be 'prefill', 'decode' or 'both', got {self.role!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")

    @property
    def kv_capacity(self) -> int:
        """Token slots in the whole KV pool: the longest sequence (prompt + output) that can ever run."""
        return self.num_kv_blocks * self.block_size
