"""Make a tiny random Llama that vLLM's CPU build can serve, with no download: ``python tiny_model.py DIR``.

Weights are random (seeded), the tokenizer is a byte-level BPE trained here on a few lines of text, with
a chat template so ``/v1/chat/completions`` works. Sizes fit vLLM's CPU attention (head_dim 32, a
multiple of 32 for the KV block size). Idempotent: an existing model in DIR is kept.
"""

from __future__ import annotations

import sys
from pathlib import Path

VOCAB = 512
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Every request an inference engine serves becomes a trace with queue, prefill and decode spans.",
    "A preempted request waits, then its KV cache is recomputed from the prompt and its tokens.",
    "Time to first token, inter-token latency and time per output token are histograms.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?-_()[]{}<>|/'\"",
]


def make(directory: Path) -> Path:
    if (directory / "config.json").exists() and (directory / "tokenizer.json").exists():
        return directory
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    config = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=1024,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


if __name__ == "__main__":
    print(make(Path(sys.argv[1])))
