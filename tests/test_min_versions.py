"""The declared minimum OpenTelemetry (pyproject.toml) is one the suite passes on.

otel-llm uses a few SDK internals (DESIGN.md names them, each guarded). This runs the tests that need
only OpenTelemetry (core, conformance, bridge, identity, wire, fault tests) in the virtualenv that
``tests/min_versions/make_env.sh`` builds with the oldest versions pyproject.toml allows, as a second
pytest process, and fails with its report when any of them fails there.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("OTEL_LLM_MIN_VENV", REPO / ".venv-min"))
CONSTRAINTS = REPO / "tests" / "min_versions" / "constraints.txt"
# The tests that need nothing but OpenTelemetry (no torch, transformers, web server).
SUITE = [
    "tests/faults",
    "tests/test_anomalies.py",
    "tests/test_buckets.py",
    "tests/test_concurrency.py",
    "tests/test_conformance.py",
    "tests/test_engine_steps.py",
    "tests/test_export_answers.py",
    "tests/test_file_default.py",
    "tests/test_global_providers.py",
    "tests/test_identity.py",
    "tests/test_metrics_bridge.py",
    "tests/test_otlp_wire.py",
    "tests/test_properties.py",
    "tests/test_setup.py",
    "tests/test_span_paths.py",
    "tests/test_trace_shape.py",
    "tests/test_wire.py",
]


def declared_minimums() -> dict[str, str]:
    text = (REPO / "pyproject.toml").read_text()
    block = text[text.index("dependencies = [") : text.index("]", text.index("dependencies = ["))]
    return dict(re.findall(r'"(opentelemetry-[a-z-]+)>=([0-9.a-z]+)"', block))


def test_the_constraints_pin_exactly_the_declared_minimums() -> None:
    pinned = dict(
        line.split("#")[0].strip().split("==")
        for line in CONSTRAINTS.read_text().splitlines()
        if line.split("#")[0].strip()
    )
    for name, version in declared_minimums().items():
        assert pinned.get(name) == version, (name, version, pinned.get(name))


def test_the_suite_passes_at_the_declared_minimum_opentelemetry() -> None:
    python = VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(
            f"{VENV} is missing: run `bash tests/min_versions/make_env.sh` (the README's test command does)"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTEST_"))}
    done = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITE],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    tail = "\n".join(done.stdout.splitlines()[-40:])
    assert done.returncode == 0, f"at the declared minimum:\n{tail}\n{done.stderr[-2000:]}"
