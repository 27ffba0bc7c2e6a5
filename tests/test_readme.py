"""The README's set-up commands are what CI runs: .ci/run must run exactly the README's test command.

The metric names the README and the reference page (docs/telemetry.md) give are the ones we emit, and
the reference names every one of them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block, "the README must open with a bash block of set-up commands"
    return [line for line in first_block.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_a_demo_and_a_test_command():
    demo, tests = readme_commands()
    assert demo.endswith("otel-llm demo")
    assert "pytest" in tests
    assert "pip install -q torch==2.13.0" in demo and "pip install -q torch==2.13.0" in tests


def test_ci_runs_exactly_the_readme_test_command():
    _, tests = readme_commands()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci, "the test command in .ci/run differs from the README's"


METRIC_NAME = re.compile(r"`((?:gen_ai\.server|llm\.server|otel_llm)\.[a-z_.]+)`")
REFERENCE = ROOT / "docs" / "telemetry.md"  # spans, attributes, events and metrics


def emitted_metrics() -> set[str]:
    from otel_llm import semconv as sc

    return {v for k, v in vars(sc).items() if k.startswith("METRIC_")}


def scope_names() -> set[str]:
    """Instrumentation scope names the pages give, which look like metric names but are not."""
    from otel_llm.kit.engine import telemetry

    return {telemetry._SCOPE}


def test_every_readme_metric_name_is_one_we_emit():
    emitted = emitted_metrics()
    for page in (ROOT / "README.md", REFERENCE):
        named = set(METRIC_NAME.findall(page.read_text())) - scope_names()
        assert named <= emitted, (page.name, named - emitted)


def test_the_reference_names_every_metric_we_emit():
    named = set(METRIC_NAME.findall(REFERENCE.read_text()))
    assert named, "docs/telemetry.md should list the metrics"
    assert emitted_metrics() <= named, emitted_metrics() - named


def test_readme_sglang_server_command_is_the_tested_one_without_cpu_settings():
    # The SGLang server tier runs docs/sglang.md's CPU block word for word; the general block must be the
    # same command without what only SGLang's CPU engine needs.
    from tests.sglang.serve import readme_server_commands

    general, cpu = readme_server_commands()
    cpu_only_flags = {"--device", "--attention-backend", "--dtype", "--max-total-tokens"}
    cpu_only = {"--disable-cuda-graph", "--skip-server-warmup", "SGLANG_USE_CPU_ENGINE=1"}

    def without_cpu(line: str) -> str:
        words, kept = line.split(), []
        while words:
            word = words.pop(0)
            if word in cpu_only_flags:
                words.pop(0)
            elif word not in cpu_only:
                kept.append(word)
        return " ".join(kept)

    assert [line for line in general if not line.startswith("pip ")] == [without_cpu(line) for line in cpu]
