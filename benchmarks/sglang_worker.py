"""One offline SGLang engine that runs the same batch whenever asked; the other side of sglang_cost.py.

Runs in the SGLang virtualenv: ``python -m benchmarks.sglang_worker MODEL_DIR``. Whether otel_llm is
active is decided by the environment the parent gives it (``SGLANG_PLUGINS``), so both variants run
this same code. Prints ``ready`` after a warm-up batch, then for each ``run`` line on stdin runs the
batch and prints ``{"tokens": output tokens, "seconds": perf_counter seconds}`` as one JSON line;
``quit`` (or the end of stdin) shuts the engine down.
"""

from __future__ import annotations

import json
import sys
import time

PROMPTS = 24
MAX_NEW_TOKENS = 64
ENGINE_ARGS = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "dtype": "float32",
    "disable_cuda_graph": True,
    "skip_server_warmup": True,
    "max_total_tokens": 4096,  # room for the whole batch: no retraction, a steady decode loop
    "context_length": 512,
    "log_level": "error",
}


def main() -> None:
    import sglang

    engine = sglang.Engine(model_path=sys.argv[1], **ENGINE_ARGS)
    prompts = [f"Request {i}: tell me a story about tokens and batches" for i in range(PROMPTS)]
    params = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0}
    try:
        engine.generate(prompts[:4], params)  # warm-up: first-use costs
        print("ready", flush=True)
        for line in sys.stdin:
            if line.strip() != "run":
                break
            started = time.perf_counter()
            outputs = engine.generate(prompts, params)
            seconds = time.perf_counter() - started
            tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs)
            print(json.dumps({"tokens": tokens, "seconds": seconds}), flush=True)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
