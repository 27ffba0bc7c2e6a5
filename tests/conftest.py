"""Shared fixtures: a harness (a tracker and what it exported), in export mode ``in_process`` (real SDK
providers with in-memory exporters, tests/harness.py) or, for tests marked ``both_modes``, in both modes:
``process`` puts the export process and a real OTLP receiver between the tracker and the test
(tests/export_harness.py).
Also the hooks of ``python -m pytest --quick`` (tests/quick_run.py) and the skip accounting
(tests/skips.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import US, Harness, RequestTrace  # noqa: F401  (re-exported for the test modules)
from quick_run import pytest_addoption, pytest_cmdline_main, pytest_ignore_collect, pytest_terminal_summary

# pytest finds them here
QUICK_RUN_HOOKS = (pytest_addoption, pytest_cmdline_main, pytest_ignore_collect, pytest_terminal_summary)
EXPORT_MODES = ("in_process", "process")


def pytest_configure(config: pytest.Config) -> None:
    import skips  # a failed tier build's output at the end of the run; OTEL_LLM_FAIL_ON_SKIP

    config.pluginmanager.register(skips, "otel-llm-skips")
    config.addinivalue_line(
        "markers", "both_modes: run the test's harness in export mode in_process and in export mode process"
    )
    config.addinivalue_line(
        "markers",
        "in_process_only(why): in a both_modes module, a test that reads what only the engine's process has",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    both = metafunc.definition.get_closest_marker("both_modes")
    alone = metafunc.definition.get_closest_marker("in_process_only")
    if "export_mode" in metafunc.fixturenames and both and not alone:
        metafunc.parametrize("export_mode", EXPORT_MODES, indirect=True)


@pytest.fixture
def export_mode(request: pytest.FixtureRequest) -> str:
    """``in_process``, or each mode for a test marked ``both_modes``."""
    return getattr(request, "param", "in_process")


def new_harness(mode: str, **kwargs: Any) -> Any:
    if mode == "process":
        from export_harness import ExportHarness

        return ExportHarness(**kwargs)
    return Harness(**kwargs)


@pytest.fixture
def harness(export_mode: str) -> Iterator[Any]:
    h = new_harness(export_mode)
    yield h
    h.close()


@pytest.fixture
def make_harness(export_mode: str) -> Iterator[Any]:
    made: list[Any] = []

    def make(**kwargs: Any) -> Any:
        h = new_harness(export_mode, **kwargs)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


@pytest.fixture
def started() -> Iterator[list[Any]]:
    """Receivers and ``Telemetry`` handles a test starts: stopped / shut down even when the test fails.

    Shutdown is bounded (a test may leave its collector black-holed), so cleanup never hangs a run.
    """
    from otel_llm.export.telemetry import Telemetry

    things: list[Any] = []
    yield things
    for thing in reversed(things):
        if isinstance(thing, Telemetry):
            thing.shutdown(timeout_s=2)
        else:
            thing.stop()


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No OTEL_* variable from the machine; metrics leave only on an explicit flush (no timing
    dependence); the working directory is the test's own, so a file fallback lands there."""
    from otlp_receivers import clear_otel_env

    clear_otel_env(monkeypatch)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")
    monkeypatch.chdir(tmp_path)
    return monkeypatch


# One run of each command, writing files, for every test that only reads what it wrote.
SERVED_REQUESTS = [
    ("/v1/completions", {"model": "otel-llm-tiny", "prompt": "hi", "max_tokens": 2}),
    (
        "/v1/chat/completions",
        {"model": "otel-llm-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    ),
]


@pytest.fixture(scope="session")
def served_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    """``otel-llm serve --port 0`` answering one completion and one chat completion: (port, run folder)."""
    pytest.importorskip("torch", reason="the reference engine needs the torch extra")
    pytest.importorskip("fastapi", reason="the serve extra")
    from cli_runs import serve_files

    return serve_files(tmp_path_factory.mktemp("serve"), SERVED_REQUESTS)


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """``otel-llm demo --requests 8`` writing files: (what it printed, its run folder)."""
    pytest.importorskip("torch", reason="the reference engine needs the torch extra")
    from cli_runs import demo_files

    return demo_files(tmp_path_factory.mktemp("demo"), "--requests", "8")
