"""The core type-checks clean: mypy, configured in pyproject.toml ([tool.mypy]), reports no error.

The core is what a user installs into an engine (hooks, record, emit, export, integrations and the
top-level modules); the try-out kit under ``otel_llm/kit`` is not checked. mypy comes with the ``dev``
extra. Its cache (``.mypy_cache``) makes a second run take seconds instead of half a minute.

The second test shows the check can fail: the same run, with one wrong assignment planted in a module of
each part of the core, must name every one of them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 300  # a cold run takes about 30 s of CPU on an idle core

# One module of each part of the core the configuration must cover.
PLANTED = [
    "otel_llm/hooks/inflight.py",
    "otel_llm/record/wire.py",
    "otel_llm/emit/pipeline.py",
    "otel_llm/export/telemetry.py",
    "otel_llm/integrations/patching.py",
    "otel_llm/tracker.py",
    "otel_llm/setup.py",
]
WRONG = 'planted_by_test_types: int = "not an int"\n'


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def test_the_core_type_checks_clean() -> None:
    done = mypy()
    assert "No module named mypy" not in done.stderr, "mypy is missing: pip install -e '.[dev]'"
    assert done.returncode == 0, f"mypy exited {done.returncode}:\n{done.stdout[-6000:]}{done.stderr[-2000:]}"
    assert done.stdout.startswith("Success: no issues found"), done.stdout


def test_the_configuration_covers_the_core_and_not_the_kit() -> None:
    # tomllib is Python 3.11+; the list is read plainly (a quoted path per line, as pyproject.toml has it).
    section = (ROOT / "pyproject.toml").read_text().split("[tool.mypy]", 1)[1]
    files = re.findall(r'^\s*"([^"]+)",?$', section.split("files = [", 1)[1].split("]", 1)[0], re.M)
    assert files, section[:500]
    assert not [f for f in files if f.startswith("otel_llm/kit")], files
    top = {p.name for p in (ROOT / "otel_llm").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    covered = {Path(f).name for f in files}
    unchecked = top - covered - {"kit"}
    assert not unchecked and "kit" in top, f"parts of otel_llm neither checked nor the kit: {unchecked}"


def test_a_wrong_type_in_any_part_of_the_core_fails_the_check(tmp_path: Path) -> None:
    shadows: list[str] = []
    lines: dict[str, int] = {}
    for module in PLANTED:
        text = (ROOT / module).read_text()
        shadow = tmp_path / module.replace("/", "_")
        shadow.write_text(text + WRONG)
        shadows += ["--shadow-file", module, str(shadow)]
        lines[module] = text.count("\n") + 1
    done = mypy(*shadows)
    assert done.returncode == 1, f"mypy exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
    for module, line in lines.items():
        planted = f"{module}:{line}: error: Incompatible types in assignment"
        assert planted in done.stdout, done.stdout
