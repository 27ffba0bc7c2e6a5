"""What the vLLM cost benchmark runs: its six variants and its workloads, as plain data.

Imported by the controller (development virtualenv) and by the workers (engine virtualenv), so it
imports nothing beyond the standard library. A variant is everything that differs between the six
worker processes of one workload: their environment, ``LLM`` arguments and what the worker switches on
in code; a workload is the batch every variant's worker runs and the engine's KV-cache size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BARE = "bare"
VLLM_STATS = "vllm-stats"
VLLM_TRACING = "vllm-tracing"
OTEL_PHASES = "otel-phases"
OTEL_TAIL = "otel-tail"
OTEL_REQUEST = "otel-request"


@dataclass(frozen=True)
class Variant:
    """One way of running vLLM's frontend: its environment, ``LLM`` arguments and code switches.

    ``otel_llm``: the worker calls ``otel_llm.configure()`` and ``VLLMInstrumentor().instrument()``
    before building the ``LLM``, as docs/vllm.md's "In code" example does, and the plugin stays on in the
    engine core; otherwise ``VLLM_PLUGINS`` is empty, so vLLM loads no general plugin in any process.
    ``receiver``: the variant exports to the loopback OTLP gRPC receiver.
    """

    name: str
    label: str  # the report's row label
    otel_llm: bool
    log_stats: bool  # LLM(disable_log_stats=not log_stats)
    vllm_tracing: bool  # LLM(otlp_traces_endpoint=<receiver>)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def receiver(self) -> bool:
        return self.otel_llm or self.vllm_tracing

    def environment(self, endpoint: str) -> dict[str, str]:
        """The worker's variant-specific environment; ``endpoint`` is the receiver's ``http://host:port``."""
        env = {"OTEL_SERVICE_NAME": f"vllm-cost-{self.name}", **self.env}
        if not self.otel_llm:
            # vLLM splits VLLM_PLUGINS on commas and loads only the names listed: "" lists none.
            env["VLLM_PLUGINS"] = ""
        else:
            # The OTLP set-up of docs/vllm.md: the standard variables, read by otel_llm.configure().
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
            env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "grpc"
        return env


VARIANTS: tuple[Variant, ...] = (
    Variant(BARE, "bare (`disable_log_stats=True`, plugin off)", False, False, False),
    Variant(VLLM_STATS, "vLLM's own stats (its stat loggers)", False, True, False),
    Variant(VLLM_TRACING, "vLLM's own tracing (one `llm_request` span; stats on)", False, True, True),
    Variant(OTEL_PHASES, "otel-llm, phases, every trace, OTLP gRPC", True, False, False),
    Variant(
        OTEL_TAIL,
        "otel-llm, tail sampling 5 %",
        True,
        False,
        False,
        {"OTEL_LLM_TAIL_SAMPLING": "on", "OTEL_LLM_TAIL_SAMPLING_RATIO": "0.05"},
    ),
    Variant(
        OTEL_REQUEST, "otel-llm, detail `request`", True, False, False, {"OTEL_LLM_TRACE_DETAIL": "request"}
    ),
)
BY_NAME = {v.name: v for v in VARIANTS}


_WORDS = "the quick brown fox jumps over the lazy dog and keeps on running far away".split()  # noqa: SIM905


@dataclass(frozen=True)
class Workload:
    """One batch for ``LLM.generate`` and the engine it runs on.

    ``prompts`` requests of ``max_tokens`` output tokens each (``ignore_eos``, so every round produces
    the same number of tokens), prompts of about ``prompt_words`` words; a KV cache of ``blocks`` blocks
    of ``block_size`` tokens (``num_gpu_blocks_override``), which decides how often vLLM preempts.
    """

    name: str
    title: str
    prompts: int
    max_tokens: int
    prompt_words: int
    blocks: int
    block_size: int
    max_num_seqs: int
    rounds: int  # timed rounds per variant
    profile_rounds: int  # extra rounds of the phases variant with entry-point counters

    @property
    def max_model_len(self) -> int:
        # vLLM refuses a max_model_len that its KV cache cannot hold, one block (its null block) aside.
        return min(512, (self.blocks - 1) * self.block_size)

    def describe(self) -> str:
        return (
            f"{self.prompts} prompts x {self.max_tokens} output tokens, KV cache of {self.blocks} blocks x "
            f"{self.block_size} tokens, up to {self.max_num_seqs} running"
        )

    def llm_kwargs(self) -> dict[str, Any]:
        """``LLM(...)`` arguments of this workload (the model and variant arguments come on top)."""
        return {
            "dtype": "float32",
            "max_model_len": self.max_model_len,
            "enforce_eager": True,
            "block_size": self.block_size,
            "num_gpu_blocks_override": self.blocks,
            # vLLM's own token budget per step (4,096 for LLM on CPU) prefills every workload's prompts at
            # once; only the number of running requests is set.
            "max_num_seqs": self.max_num_seqs,
            "seed": 0,
        }

    def texts(self) -> list[str]:
        words = _WORDS
        body = " ".join(words[i % len(words)] for i in range(self.prompt_words))
        return [f"Request {i}: {body}" for i in range(self.prompts)]


WORKLOADS: tuple[Workload, ...] = (
    # The settings (it counted about 7 preemptions a round; measured here: about 29).
    Workload("issue", "24 requests, KV cache of 20 blocks", 24, 96, 9, 20, 32, 256, 30, 4),
    # Fewer blocks: most requests are preempted at least once, several more than once.
    Workload("tight", "24 requests, KV cache of 12 blocks", 24, 96, 9, 12, 32, 256, 18, 3),
    # A batch a GPU would run: many short requests at once, a KV cache that never preempts.
    Workload("wide", "192 concurrent short requests, no preemption", 192, 32, 4, 448, 32, 256, 18, 3),
)
QUICK_WORKLOADS: tuple[Workload, ...] = (
    Workload("quick", "8 requests, KV cache of 4 blocks", 8, 24, 9, 4, 32, 64, 2, 1),
)
