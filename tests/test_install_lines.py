"""Every install line the README, docs/ and the CLI give works for one who has only cloned the repository.

otel-llm is installed from its checkout, not from an index, so a line such as ``pip install otel-llm``
fails for a newcomer. The lines run in one fresh virtualenv (real pip, the index or its cache) on a copy
of the checkout: the core install for real (no torch, no fastapi: ``otel-llm serve`` there must name
every missing extra and the line that installs them), then the checkout as the lines name it, with every
extra they ask for, resolved with ``--dry-run --no-deps`` (the point: the lines are right). Requirements
from an index (torch, vllm, openai, ...) are only checked not to be otel-llm itself.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIP_TIMEOUT_S = 600
LOCAL = re.compile(r"\.(\[([a-z0-9_,-]+)\])?")  # the checkout, with extras: . or .[torch,serve]


def readme_install_lines() -> list[list[str]]:
    """The arguments of every ``pip install`` in the README and the pages of docs/ (code blocks and
    inline code)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    text = "\n".join(page.read_text() for page in pages)
    found = []
    for command in re.findall(r"pip install [^`\n&#]*", text):
        words = shlex.split(command.split("  ", 1)[0])  # two spaces start an aligned comment
        found.append(words[2:])
    return found


def requirements(args: list[str]) -> list[str]:
    """The requirements a ``pip install`` names (options dropped)."""
    return [a for a in args if not a.startswith("-")]


def extras_asked(lines: list[list[str]]) -> set[str]:
    """Every extra of the checkout that ``lines`` ask for. Fails on a local path other than the checkout."""
    extras: set[str] = set()
    for args in lines:
        for req in requirements(args):
            local = LOCAL.fullmatch(req)
            if local:
                extras.update(filter(None, (local.group(2) or "").split(",")))
            else:
                assert not req.startswith((".", "/")), f"pip install {' '.join(args)}: not the checkout"
    return extras


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what a clone holds that pip reads (the package, pyproject.toml, README.md)."""
    dest = tmp_path_factory.mktemp("clone")
    shutil.copytree(ROOT / "otel_llm", dest / "otel_llm", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    return dest


def pip(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """This suite's pip, installing into the virtualenv of ``python`` (no pip of its own to set up)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--disable-pip-version-check",
            *args,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def core_install(tmp_path_factory: pytest.TempPathFactory, clone: Path) -> Path:
    """A fresh virtualenv with the core install from the clone; returns its python."""
    where = tmp_path_factory.mktemp("venv")
    venv.create(where, with_pip=False)
    python = where / "bin" / "python"
    done = pip(python, clone, "-q", ".")
    assert done.returncode == 0, done.stderr[-2000:]
    return python


def test_no_readme_line_installs_otel_llm_from_an_index() -> None:
    lines = readme_install_lines()
    assert lines, "the README should say how to install"
    for args in lines:
        named = [re.split(r"[\[<>=!~]", r)[0].lower() for r in requirements(args)]
        assert not {"otel-llm", "otel_llm"} & set(named), f"pip install {' '.join(args)}: no index has it"


def test_the_cli_names_every_missing_extra_and_every_line_resolves(core_install: Path, clone: Path) -> None:
    cli = core_install.parent / "otel-llm"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHON"))}
    done = subprocess.run([str(cli), "serve"], cwd=clone, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (said,) = done.stderr.strip().splitlines()  # one line
    for module in ("torch", "rich", "fastapi", "uvicorn"):  # all of them at once
        assert module in said, said
    cli_lines = [shlex.split(part) for part in said.split(" run ", 1)[1].split(" && ")]
    assert all(words[:2] == ["pip", "install"] for words in cli_lines), said
    # Every extra the CLI's line and the README's lines ask for exists (pip only warns about one that
    # does not), and the checkout installs as those lines install it (editable), with those extras.
    extras = extras_asked([words[2:] for words in cli_lines] + readme_install_lines())
    declared = subprocess.run(
        [
            str(core_install),
            "-c",
            "import importlib.metadata as m; print(*m.metadata('otel-llm').get_all('Provides-Extra'))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()
    assert extras and extras <= set(declared), extras - set(declared)
    args = ["-e", f".[{','.join(sorted(extras))}]"]
    resolved = pip(core_install, clone, "--dry-run", "--no-deps", *args)
    assert resolved.returncode == 0, f"pip install {' '.join(args)}:\n{resolved.stderr[-2000:]}"
