"""A bad environment value is handled like a bad flag by every command: one line naming the variable,
exit status 2, no traceback, before anything heavy starts. Real subprocesses of the CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

BAD = [
    ({"OTEL_LLM_TAIL_SAMPLING": "on", "OTEL_LLM_TAIL_SAMPLING_RATIO": "1.5"}, "OTEL_LLM_TAIL_SAMPLING_RATIO"),
    ({"OTEL_LLM_TAIL_SAMPLING": "on", "OTEL_LLM_TAIL_SAMPLING_E2E_S": "-1"}, "OTEL_LLM_TAIL_SAMPLING_E2E_S"),
    (
        {"OTEL_LLM_TAIL_SAMPLING": "on", "OTEL_LLM_TAIL_SAMPLING_TTFT_S": "nan"},
        "OTEL_LLM_TAIL_SAMPLING_TTFT_S",
    ),
    ({"OTEL_LLM_TAIL_SAMPLING": "sometimes"}, "OTEL_LLM_TAIL_SAMPLING"),
    ({"OTEL_LLM_TRACE_DETAIL": "everything"}, "OTEL_LLM_TRACE_DETAIL"),
    ({"OTEL_LLM_SHUTDOWN_TIMEOUT": "soon"}, "OTEL_LLM_SHUTDOWN_TIMEOUT"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
]


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    clean.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "otel_llm.cli", *args], env=clean, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("command", ["demo", "serve"])
@pytest.mark.parametrize(("env", "variable"), BAD, ids=[v for _, v in BAD])
def test_a_bad_environment_value_is_a_usage_error(command: str, env: dict[str, str], variable: str) -> None:
    done = cli(command, "--port", "0", **env) if command == "serve" else cli(command, **env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # one line, no traceback
    assert re.match(rf"otel-llm {command}: error: {variable}\b", lines[0]), lines[0]  # that variable


def test_a_bad_flag_reads_the_same() -> None:
    # The shape the environment errors copy: argparse's one error line, exit 2.
    done = cli("demo", "--requests", "x")
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("otel-llm demo: error:")
