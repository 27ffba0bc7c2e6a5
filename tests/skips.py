"""Skips, accounted for: a tier that could not be built says why, and CI counts no skip as a pass.

A ``--best-effort`` build (tests/venv_tools.sh ``best_effort``) that fails leaves its output in
``.venv-failed/NAME.log`` (another folder: ``OTEL_LLM_FAILED_BUILDS``); the end of the test run shows
the last lines of each, where a run's output is read (a CI log is often only its tail). With
``OTEL_LLM_FAIL_ON_SKIP=1`` (``.ci/run`` sets it) a run that skipped any test exits 1 even when every
test that ran passed. tests/conftest.py registers this module as a plugin.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FAILED_BUILDS = Path(os.environ.get("OTEL_LLM_FAILED_BUILDS") or REPO / ".venv-failed")
LOG_TAIL = 25  # lines of each failed build's output shown: its error, and the free disk space
FAIL_ON_SKIP = "OTEL_LLM_FAIL_ON_SKIP"

skip_reasons: Counter[str] = Counter()


def fail_on_skip() -> bool:
    return os.environ.get(FAIL_ON_SKIP, "") not in ("", "0")


def reason_of(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        skip_reasons[reason_of(report)] += 1


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a module-level pytest.skip / importorskip
        skip_reasons[reason_of(report)] += 1


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if fail_on_skip() and skip_reasons and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for log in sorted(FAILED_BUILDS.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        terminalreporter.write_sep("-", f"the {log.stem} tier could not be built: the end of {log.name}")
        for line in lines[-LOG_TAIL:]:
            terminalreporter.write_line(line)
    if fail_on_skip() and skip_reasons:
        skipped = sum(skip_reasons.values())
        terminalreporter.write_sep("=", f"{FAIL_ON_SKIP}: {skipped} skipped; the run fails")
        for reason, count in skip_reasons.most_common():
            terminalreporter.write_line(f"{count:5d}  {reason}")
