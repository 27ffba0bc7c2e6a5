"""``python -m pytest --quick`` (tests/quick_run.py) leaves out the tiers that need built environments.

A real pytest collects the tests folder, with every module outside the tiers left out of it
(``--ignore``) so that only the tiers could be collected: seconds, not the suite's collection.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from quick_run import TESTS, TIERS

ROOT = TESTS.parent
NO_TESTS_COLLECTED = 5  # pytest's exit status
TIER_PATHS = [TESTS / name for _, names in TIERS for name in names]


def collect(*options: str, leave_out: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``pytest --collect-only`` of the tests folder with nothing but the tiers (and ``leave_out``) in it."""
    others = [
        p for p in TESTS.iterdir() if p not in TIER_PATHS and (p.is_dir() or p.name.startswith("test_"))
    ]
    ignored = [*others, *(TESTS / name for name in leave_out)]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *options]
        + [f"--ignore={p}" for p in ignored]
        + ["tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_quick_collects_no_tier_and_says_so_in_one_line() -> None:
    for path in TIER_PATHS:  # the table names real tiers
        assert path.is_file() or any(path.rglob("test_*.py")), f"{path} holds no tests"
    done = collect("--quick")
    said = done.stdout + done.stderr
    assert done.returncode == NO_TESTS_COLLECTED, said  # nothing of the tiers was even collected
    (line,) = [line for line in said.splitlines() if "left out" in line]
    for path in TIER_PATHS:
        assert str(path.relative_to(ROOT)) in line, line
    assert "SKIPPED" not in said and "rror" not in said, said


def test_without_quick_the_minimum_version_tier_is_collected() -> None:
    # What the README's command 2 runs, unchanged: here, the tier that fails when its environment is missing.
    done = collect(leave_out=("vllm", "sglang", "collector", "router", "phoenix"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tests/test_min_versions.py::" in done.stdout, done.stdout
    assert "left out" not in done.stdout, done.stdout


def test_the_readme_gives_the_quick_command() -> None:
    assert "python -m pytest --quick" in (ROOT / "README.md").read_text()


LAYOUT = "tests/test_layout.py"  # a few fast tests


def run_quick(*options: str) -> str:
    """What ``pytest --quick OPTIONS`` prints for one small module of the suite, which must pass."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--quick", "-p", "no:cacheprovider", *options, LAYOUT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_quick_spreads_over_two_workers_per_core_unless_told_otherwise() -> None:
    spread = re.search(r"^(\d+) workers \[\d+ items?\]", run_quick(), re.M)
    assert spread, "--quick ran in one process"
    assert int(spread.group(1)) == 2 * (os.cpu_count() or 1)
    for alone in (("-p", "no:xdist"), ("-n", "0")):
        assert " workers [" not in run_quick(*alone), alone
