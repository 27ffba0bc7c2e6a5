"""Running a driver script in an engine's own virtualenv (vLLM, SGLang) from a test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def run_or_fail(command: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> None:
    """Run ``command``; if it exits non-zero, write the tail of its output to stderr and fail the test
    (pytest shows it under the failure: an engine's own traceback is the one worth reading)."""
    proc = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        pytest.fail(f"{Path(command[1]).name} exited {proc.returncode}; its output is above")
