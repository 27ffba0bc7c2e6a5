"""The pictures of the documentation are what the code draws today, and the demo's output in
docs/demo.md is a real run's.

``docs/pictures/make_pictures.py`` runs the demo and draws ``otel-llm view``'s waterfall as SVG; here it
draws it again from a fresh run (not compared byte for byte: timings differ from run to run) and the
SVG must be well formed and show that run's request, its trace id and every span of its trace. The
picture in the repository must be such an SVG too, and the README must show it. docs/demo.md's sample
of the demo's output must have the rows and lines a run prints today.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from pictures import PICTURES, ROOT, make_pictures, spans_by_trace

NS = "{http://www.w3.org/2000/svg}"
SVG = f"{NS}svg"


def svg_text(svg: str) -> str:
    """The text an SVG shows."""
    root = ET.fromstring(svg)
    assert root.tag == SVG, root.tag
    # rich writes a line as several text elements (one per style) and its spaces as no-break spaces
    return "".join("".join(e.itertext()) for e in root.iter(f"{NS}text")).replace("\xa0", " ")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A fresh demo run: its folder, what it printed, and its waterfall as make_pictures draws it."""
    pictures = make_pictures()
    run, printed = pictures.run_demo(tmp_path_factory.mktemp("demo"))
    return run, printed, pictures.view_svg([str(run)])


def test_the_waterfall_svg_shows_the_request_and_every_span_of_its_trace(demo: tuple[Path, str, str]) -> None:
    run, _, svg = demo
    text = svg_text(svg)
    shown = re.search(r"request (req-\d+) *trace ([0-9a-f]{32})", text)  # rich drops whitespace-only runs
    assert shown, text[:2000]
    spans = spans_by_trace(run)
    assert shown.group(2) in spans, "the picture's trace is not in the run's files"
    for name in spans[shown.group(2)]:
        assert name in text, f"{name} is not in the picture"
    assert "preemptions:" in text and "═ request" in text  # the figures and the legend under the waterfall


def test_the_picture_in_the_repository_is_a_waterfall_and_the_readme_shows_it() -> None:
    text = svg_text((PICTURES / "waterfall.svg").read_text())
    for name in ("llm.request", "llm.queue", "llm.prefill", "llm.decode", "llm.preempted", "llm.recompute"):
        assert name in text, name
    assert "](docs/pictures/waterfall.svg)" in (ROOT / "README.md").read_text()


def demo_sample() -> list[str]:
    """The demo run shown in docs/demo.md (the README links there)."""
    text = (ROOT / "docs" / "demo.md").read_text()
    (sample,) = re.findall(r"```text\n\$ otel-llm demo\n(.*?)```", text, re.S)
    return sample.splitlines()


def table_rows(lines: list[str]) -> list[str]:
    return [line.split("│")[1].strip() for line in lines if line.startswith("│")]


def test_the_demo_page_shows_what_the_demo_prints(demo: tuple[Path, str, str]) -> None:
    _, printed, _ = demo
    shown, real = demo_sample(), printed.splitlines()
    assert table_rows(shown) == table_rows(real), "docs/demo.md's summary table has other rows than a run's"
    prefixes = ("request req-", "TTFT: ", "preemptions: ", "stalls by cause: ", "a stall: ", "engine time: ")
    prefixes += ("traces: ",)
    for prefix in (*prefixes, "metrics: ", "view a request: "):
        # The waterfall's figures are wrapped to the width: with other timings (a busy machine) a
        # figure can start a line or follow another one on it, two spaces after it.
        assert any(line.startswith(prefix) or f"  {prefix}" in line for line in shown), prefix
        assert any(line.startswith(prefix) or f"  {prefix}" in line for line in real), prefix
    assert shown[-1] == real[-1], "the demo's last line (how to send to a collector) is not docs/demo.md's"
