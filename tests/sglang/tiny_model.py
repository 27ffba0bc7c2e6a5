"""Make the tiny random Llama the SGLang tests serve: no download, seconds on a CPU.

Hidden size 128, 4 heads, 2 layers, vocabulary 512 with a byte-level BPE tokenizer trained here on a few
lines of text, random weights from a fixed seed (greedy output is deterministic), positions up to 2048
(the server tests need a request long enough to disconnect from). Runs in the SGLang virtualenv (it
needs torch, transformers and tokenizers): ``python tiny_model.py DIR [--stops-early]``.

Two variants: by default EOS can never win (every request runs to ``max_new_tokens``); with
``stops_early`` the EOS row keeps its random weights, so greedy decoding ends some prompts on EOS (the
drivers' prompts #0 and #8 after 22 and 18 tokens) while others run on: the overlap scheduler's
duplicate-finish case.
"""

from __future__ import annotations

import sys
from pathlib import Path

VOCAB = 512
EOS = "</s>"
BOS = "<s>"
# Enough text for the BPE trainer to fill its vocabulary with merges.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog while the scheduler admits another prefill batch.",
    "Large language model servers queue requests, run prefill, then decode one token per step.",
    "When the key value cache is full a running request is retracted and recomputed later on.",
    "OpenTelemetry traces show queue, prefill, decode, preempted and recompute spans per request.",
    "Hello world, tell me a story about tokens, batches, latency, throughput and patient users.",
] * 20
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make(directory: Path, stops_early: bool = False) -> Path:
    """Write config, weights and tokenizer into ``directory`` (created) and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)

    config = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=2,
        vocab_size=VOCAB,
        max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    if not stops_early:
        with torch.no_grad():
            # A zero logit for EOS: random weights would otherwise stop some prompts after a token or
            # two, and the KV-pressure runs need requests that run to max_new_tokens.
            model.lm_head.weight[fast.eos_token_id].zero_()
    model.save_pretrained(directory)
    return directory


if __name__ == "__main__":
    print(make(Path(sys.argv[1]), stops_early="--stops-early" in sys.argv[2:]))
