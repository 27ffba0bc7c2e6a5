"""docs/configuration.md lists every variable otel-llm reads: each ``OTEL_LLM_*`` name written in the
package's source, found by reading the source (not a list kept beside it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"[\"'](OTEL_LLM_[A-Z0-9_]+)[\"']")  # a variable's name as a string in the code


def test_the_configuration_page_names_every_otel_llm_variable_the_code_reads() -> None:
    read = {m for path in (ROOT / "otel_llm").rglob("*.py") for m in NAME.findall(path.read_text())}
    assert len(read) >= 10, read  # the search found the variables at all
    page = set(re.findall(r"`(OTEL_LLM_[A-Z0-9_]+)`", (ROOT / "docs" / "configuration.md").read_text()))
    assert sorted(read - page) == [], "read by the code, missing from docs/configuration.md"


def test_the_telemetry_page_names_every_metric_and_attribute_of_the_reference_engine() -> None:
    source = (ROOT / "otel_llm" / "kit" / "engine" / "telemetry.py").read_text()
    names = set(re.findall(r"[\"'](llm\.engine\.[a-z_.]+)[\"']", source))
    assert len(names) >= 10, names
    page = (ROOT / "docs" / "telemetry.md").read_text()
    section = page.split("## The reference engine's own metrics", 1)[1].split("\n## ", 1)[0]
    assert "`otel_llm.engine`" in section  # the scope they come under
    assert sorted(n for n in names if f"`{n}`" not in section) == []
