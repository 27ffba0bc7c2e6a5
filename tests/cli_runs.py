"""Running the ``otel-llm`` CLI as a user does, in a subprocess, and seeing what it imported.

``python -X importtime`` makes the interpreter itself list every module it imports (on stderr, one
``import time:`` line each), so a test can tell that a usage error came before torch was loaded without
reading the code: the list is split off, the rest of stderr is what the user saw.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What a run loads only once every check it can make without them has passed: the model's library and the
# HTTP server's (a worker process of a disaggregated run imports torch too, so none started either).
HEAVY = frozenset({"torch", "fastapi", "uvicorn"})


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    said: list[str]  # stderr without the import lines, blank lines dropped
    imported: frozenset[str]  # top-level packages imported by the CLI's own process

    @property
    def heavy(self) -> set[str]:
        return set(self.imported & HEAVY)


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without any OTEL_* (the user's settings are the test's), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(extra, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.setdefault("COLUMNS", "100")
    return env


def cli(*args: str, cwd: Path | None = None, timeout_s: float = 180, **env: str) -> Run:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "otel_llm.kit.cli", *args],
        cwd=cwd,
        env=environment(**env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    said, imported = [], set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:"):
            imported.add(line.rsplit("|", 1)[1].strip().split(".")[0])
        elif line.strip():
            said.append(line)
    return Run(done.returncode, done.stdout, said, frozenset(imported))
