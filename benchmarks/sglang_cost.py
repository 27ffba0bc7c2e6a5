"""Section 7: output tokens per second of SGLang's real offline engine with and without otel_llm.

Two worker processes of the SGLang virtualenv (``tests/sglang/make_env.sh``), identical but for
``SGLANG_PLUGINS``: ``otel_llm`` (the integration loads as a user gets it and exports over OTLP/gRPC
to a real receiver in this process, flushing each time the scheduler drains) or ``none``. Both engines
stay up; batches alternate between them and which goes first alternates by round, so drift on a shared
machine hits both. The model is the tests' tiny random Llama, so the engine's own work per token is
small and the integration's share is larger than with a real model. Skipped, with the reason printed,
when the SGLang virtualenv is missing, and in ``--quick`` runs (starting two engines takes about 30 s).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from benchmarks.report import Measure

ROOT = Path(__file__).resolve().parent.parent
SGLANG_PYTHON = Path(os.environ.get("OTEL_LLM_SGLANG_PYTHON", ROOT / ".venv-sglang" / "bin" / "python"))
VARIANTS = {"with otel_llm": "otel_llm", "without": "none"}  # name -> SGLANG_PLUGINS
START_TIMEOUT_S = 300.0


def skip_reason(quick: bool) -> str | None:
    if not SGLANG_PYTHON.exists():
        return "the SGLang virtualenv is missing (bash tests/sglang/make_env.sh builds it)"
    if quick:
        return "not in --quick runs (it starts two SGLang engines, about 30 s)"
    return None


def _env(plugins: str, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SGLANG_"))}
    env.update(
        {
            "SGLANG_USE_CPU_ENGINE": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "SGLANG_PLUGINS": plugins,
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        }
    )
    return env


def _ask(worker: subprocess.Popen[str]) -> dict[str, Any]:
    stdin: IO[str] | None = worker.stdin
    assert stdin is not None and worker.stdout is not None
    stdin.write("run\n")
    stdin.flush()
    line = worker.stdout.readline()
    if not line:
        raise RuntimeError("an SGLang benchmark worker exited")
    return json.loads(line)


def run(quick: bool, rounds: int) -> list[Measure]:
    reason = skip_reason(quick)
    if reason is not None:
        print(f"[sglang] skipped: {reason}", flush=True)
        return []
    from tests.otlp_receivers import GrpcReceiver

    workers: dict[str, subprocess.Popen[str]] = {}
    with tempfile.TemporaryDirectory() as tmp, GrpcReceiver() as receiver:
        model = Path(tmp) / "model"
        maker = [str(SGLANG_PYTHON), str(ROOT / "tests" / "sglang" / "tiny_model.py"), str(model)]
        subprocess.run(maker, check=True, capture_output=True, env=_env("none", receiver.endpoint))
        try:
            for name, plugins in VARIANTS.items():
                workers[name] = subprocess.Popen(
                    [str(SGLANG_PYTHON), "-m", "benchmarks.sglang_worker", str(model)],
                    cwd=ROOT,
                    env=_env(plugins, receiver.endpoint),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
            for name, worker in workers.items():
                assert worker.stdout is not None
                if worker.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"the SGLang benchmark worker '{name}' did not start")
            rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
            tokens = 0
            for i in range(rounds):
                order = list(VARIANTS) if i % 2 == 0 else list(reversed(VARIANTS))
                for name in order:
                    got = _ask(workers[name])
                    tokens = got["tokens"]
                    rates[name].append(got["tokens"] / got["seconds"])
            spans = len(receiver.collected.spans())
        finally:
            for worker in workers.values():
                if worker.poll() is None and worker.stdin is not None:
                    worker.stdin.write("quit\n")
                    worker.stdin.close()
            for worker in workers.values():
                try:
                    worker.wait(60)
                except subprocess.TimeoutExpired:
                    worker.kill()
    with_, without = statistics.median(rates["with otel_llm"]), statistics.median(rates["without"])
    note = f"{tokens} output tokens per batch (24 requests x 64), {rounds} batches each, {spans} spans sent"
    print(f"[sglang] {with_:.1f} vs {without:.1f} output tokens/s", file=sys.stderr, flush=True)
    return [
        Measure(
            "sglang",
            "output tokens per second with otel_llm",
            "tok/s",
            with_,
            {"without otel_llm": without},
            spread=(min(rates["with otel_llm"]), max(rates["with otel_llm"])),
            note=note,
        ),
        Measure("sglang", "output tokens per second lost to otel_llm", "fraction", 1 - with_ / without),
    ]
