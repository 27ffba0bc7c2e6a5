"""A tier whose build failed says why, and with OTEL_LLM_FAIL_ON_SKIP=1 a skip fails the run.

Real bash runs ``best_effort`` (tests/venv_tools.sh) on a build script that fails; a real pytest, in a
subprocess, runs a test that skips with this suite's plugin (tests/skips.py) loaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def best_effort(tmp_path: Path, script_body: str) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    script = tmp_path / "make_env.sh"
    script.write_text(f"set -euo pipefail\n{script_body}\n")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)  # what a build leaves half-made
    logs = tmp_path / "failed"
    env = {**os.environ, "OTEL_LLM_FAILED_BUILDS": str(logs)}
    command = f'. "{TESTS / "venv_tools.sh"}" && best_effort demo-tier "{script}" "{venv}"'
    args = ["bash", "-euo", "pipefail", "-c", command]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    return done, venv, logs


def test_a_failed_build_is_removed_and_its_output_kept(tmp_path: Path) -> None:
    build = "echo 'Collecting vllm'\necho 'No space left on device' >&2\nexit 3"
    done, venv, logs = best_effort(tmp_path, build)
    assert done.returncode == 0, done.stderr  # the other tiers still build
    assert not venv.exists()
    log = (logs / "demo-tier.log").read_text()
    assert "No space left on device" in log and "free disk space" in log
    assert "demo-tier.log" in done.stderr  # the build's own output says where its log is
    assert not list(logs.glob("*.part"))


def test_a_build_that_succeeds_leaves_no_log(tmp_path: Path) -> None:
    done, venv, logs = best_effort(tmp_path, "echo ready")
    assert done.returncode == 0 and "ready" in done.stdout
    assert venv.exists() and not logs.exists()


def run_pytest(tmp_path: Path, fail_on_skip: str, logs: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_tier.py").write_text(
        "import pytest\n\n"
        "def test_runs():\n    assert True\n\n"
        "@pytest.mark.skip(reason='demo tier not found')\n"
        "def test_needs_the_tier():\n    pass\n"
    )
    env = {
        **os.environ,
        "OTEL_LLM_FAIL_ON_SKIP": fail_on_skip,
        "OTEL_LLM_FAILED_BUILDS": str(logs),
        "PYTHONPATH": str(TESTS),
    }
    args = [sys.executable, "-m", "pytest", "-p", "skips", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_skip_fails_the_run_when_asked_and_the_failed_build_is_shown(tmp_path: Path) -> None:
    logs = tmp_path / "failed"
    logs.mkdir()
    build_output = "pip install vllm failed\nOSError: [Errno 28] No space left on device\n"
    (logs / "demo-tier.log").write_text(build_output)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    done = run_pytest(run_dir, "1", logs)
    assert done.returncode == 1, done.stdout
    assert "1 passed, 1 skipped" in done.stdout
    assert "the demo-tier tier could not be built" in done.stdout
    assert "No space left on device" in done.stdout
    assert "demo tier not found" in done.stdout.split("OTEL_LLM_FAIL_ON_SKIP")[-1]


def test_a_skip_is_only_reported_without_the_variable(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, "", tmp_path / "no-logs")
    assert done.returncode == 0, done.stdout
    assert "1 passed, 1 skipped" in done.stdout and "OTEL_LLM_FAIL_ON_SKIP" not in done.stdout
