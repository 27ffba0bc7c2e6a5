"""The code in the README and in docs/ is what the code does today.

- Every Python block runs: the blocks of one page in order, as one script, in a fresh process with no
  OTEL_* variable set (so telemetry goes to files in a temporary folder). A block that cannot run here
  (it needs vLLM, or it is a fragment of a user's program) says so in an HTML comment on the line before
  it, ``<!-- not run: why -->``, and is compiled instead.
- A ``text`` block of two lines, ``$ command`` and one line of output, is run and must print that line.
- Every file or folder of the repository that a page names in code (``otel_llm/...``, ``examples/...``)
  exists.
- docs/install.md quotes the README's command 1 as it is.

The README's first bash block (tests/test_readme.py), its install lines (tests/test_install_lines.py)
and the SGLang page's server commands (tests/sglang/serve.py) are checked where they are run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*$")
CLI = "import sys; from otel_llm.kit.cli import main; sys.exit(main(sys.argv[1:]))"
REPO_PATH = re.compile(r"`((?:otel_llm|examples|tests|collector-config|benchmarks|docs|\.ci)/[^`\s]*)`")
TIMEOUT_S = 180


def blocks(page: Path, language: str) -> list[tuple[int, str, str | None]]:
    """The fenced blocks of ``language`` on ``page``: (line number, code, the not-run reason or None)."""
    text = page.read_text()
    found = []
    for fence in FENCE.finditer(text):
        if fence.group(1) != language:
            continue
        before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marked = NOT_RUN.search(before)
        found.append((text.count("\n", 0, fence.start()) + 1, fence.group(2), marked and marked.group(1)))
    return found


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def clean_env(tmp: Path) -> dict[str, str]:
    """No collector, files into ``tmp``, and this checkout's otel_llm first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHON"))}
    env["OTEL_LLM_OUTPUT_DIR"] = str(tmp / "out")
    env["PYTHONPATH"] = str(ROOT)
    return env


def spans_written(out: Path) -> set[str]:
    """The names of the spans in every traces.jsonl below ``out``."""
    names = set()
    for path in out.rglob("traces.jsonl"):
        for line in path.read_text().splitlines():
            for rs in json.loads(line).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    names.update(span["name"] for span in ss.get("spans", []))
    return names


RUN_PAGES = [p for p in PAGES if any(reason is None for _, _, reason in blocks(p, "python"))]


def test_the_docs_have_python_blocks_to_run() -> None:
    assert {"docs/hooks.md", "docs/disaggregated.md", "docs/telemetry.md"} <= {name(p) for p in RUN_PAGES}


@pytest.mark.parametrize("page", RUN_PAGES, ids=name)
def test_the_python_blocks_of_a_page_run(page: Path, tmp_path: Path) -> None:
    script = "\n\n".join(code for _, code, reason in blocks(page, "python") if reason is None)
    (tmp_path / "blocks.py").write_text(script)
    done = subprocess.run(
        [sys.executable, "blocks.py"],
        cwd=tmp_path,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    said = f"{name(page)}'s Python blocks exited {done.returncode}:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, said
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    if "configure()" in script and ".shutdown()" in script:
        # A page that sets up telemetry, serves requests and shuts down shows their traces: in the files.
        assert "llm.request" in spans_written(tmp_path / "out"), f"{name(page)}: no llm.request span written"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_blocks_not_run_say_why_and_compile(page: Path) -> None:
    for line, code, reason in blocks(page, "python"):
        if reason is not None:
            assert reason.strip(), f"{name(page)}:{line}: say why the block is not run"
            compile(code, f"{name(page)}:{line}", "exec")


SAMPLES = [
    (page, line, code)
    for page in PAGES
    for line, code, _ in blocks(page, "text")
    if code.startswith("$ ") and len(code.splitlines()) == 2
]


def test_the_docs_have_command_samples() -> None:
    assert any(name(page) == "docs/configuration.md" for page, _, _ in SAMPLES)


@pytest.mark.parametrize("page,line,code", SAMPLES, ids=[f"{name(p)}:{n}" for p, n, _ in SAMPLES])
def test_a_command_sample_prints_what_the_page_shows(
    page: Path, line: int, code: str, tmp_path: Path
) -> None:
    command, shown = code.splitlines()
    words = shlex.split(command[2:])
    env = clean_env(tmp_path)
    while "=" in words[0]:
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    assert words[0] == "otel-llm", f"{name(page)}:{line}: only otel-llm commands are run here"
    done = subprocess.run(
        [sys.executable, "-c", CLI, *words[1:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    said = (done.stdout + done.stderr).strip()
    assert said == shown, f"{name(page)}:{line}: the page shows\n{shown}\nthe command printed\n{said}"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_repository_path_a_page_names_exists(page: Path) -> None:
    missing = []
    for path in REPO_PATH.findall(page.read_text()):
        path = path.rstrip(".,:;)")
        if "<" in path or "*" in path:  # a pattern (run folders, wheels), not a file of the checkout
            continue
        if not (ROOT / path).exists():
            missing.append(path)
    assert not missing, f"{name(page)} names files the repository does not have: {missing}"


def test_the_install_page_quotes_command_1_as_the_readme_has_it() -> None:
    from tests.test_readme import readme_commands

    demo, _ = readme_commands()
    assert demo in (ROOT / "docs" / "install.md").read_text().splitlines()
