"""What the `opentelemetry_instrumentor` entry point costs a process that never uses vLLM.

``opentelemetry-instrument`` loads every installed instrumentor in every process it starts. Checked by
what ends up imported, in a real ``opentelemetry-instrument python -c ...`` (timings are in
``benchmarks/vllm_startup.py``): where vLLM is absent, nothing of otel_llm; where vLLM is installed, only
the small integration package, never vLLM or torch, until the program imports vLLM itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from engine_tier import ENGINE_BIN, engine_env, needs_engine

PROBE = (
    "import json, sys; "
    "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('otel_llm', 'vllm', 'torch'))))"
)


def imported_under_instrument(bin_dir: Path, env: dict[str, str], code: str = PROBE) -> list[str]:
    proc = subprocess.run(
        [str(bin_dir / "opentelemetry-instrument"), str(bin_dir / "python"), "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def quiet_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.pop("PYTHONPATH", None)
    # Nothing to export to: the distro's exporters are switched off, the loader still runs.
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    env.update(extra)
    return env


def test_without_vllm_nothing_of_otel_llm_is_imported() -> None:
    # The development environment (opentelemetry-distro is in the dev extra) has no vLLM.
    assert imported_under_instrument(Path(sys.executable).parent, quiet_env()) == []


@needs_engine
def test_with_vllm_installed_but_unused_neither_vllm_nor_torch_is_imported(tmp_path: Path) -> None:
    env = engine_env(tmp_path, **quiet_env())
    imported = imported_under_instrument(ENGINE_BIN, env)
    assert not [m for m in imported if m.split(".")[0] in ("vllm", "torch")], imported
    assert "otel_llm.integrations.vllm" in imported  # the entry point ran: it only waits


@needs_engine
def test_with_vllm_imported_later_the_entry_point_instruments_it(tmp_path: Path) -> None:
    code = (
        "import vllm.v1.engine.output_processor as op; "
        "from otel_llm.integrations.vllm import VLLMInstrumentor; "
        "wrapped = hasattr(op.OutputProcessor.process_outputs, '__wrapped__'); "
        "print(VLLMInstrumentor().is_instrumented, wrapped)"
    )
    env = engine_env(tmp_path, **quiet_env())
    proc = subprocess.run(
        [str(ENGINE_BIN / "opentelemetry-instrument"), str(ENGINE_BIN / "python"), "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == "True True"
