"""Start-up cost of otel-llm's ``opentelemetry-instrument`` entry point, vLLM installed or not.

``opentelemetry-instrument python -c pass`` with otel-llm's entry point enabled and disabled
(``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=vllm_llm``), alternating, in the development virtualenv (no
vLLM: the entry point is skipped from package metadata) and in the engine virtualenv (vLLM installed,
never imported: the entry point only places an import hook); plain ``python -c pass`` beside them.
Wall clock (``time.perf_counter``) of the whole process; the distro's exporters are off (nothing to
connect to).
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

from benchmarks.vllm_fleet import ENGINE_ENV, clean_env


def _time_process(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, cwd="/", check=True, capture_output=True)
    return time.perf_counter() - start


def startup(bin_dir: Path, rounds: int) -> dict[str, float]:
    """Median seconds (and the fastest run, ``<name> min``) of each variant; the fastest run is the
    least disturbed by other jobs on a shared machine."""
    base = clean_env(
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


def lines(starts: dict[str, dict[str, float]]) -> list[str]:
    """The Markdown section: one row per environment, milliseconds."""
    out = [
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
        out.append(f"| {env_name} | {cells[0]} | {cells[1]} | {diff:+.0f} ({diff_min:+.0f}) | {bare} |")
    return out
