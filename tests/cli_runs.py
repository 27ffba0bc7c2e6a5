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


def demo_files(cwd: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``otel-llm demo ARGS`` in ``cwd``, writing files: what it printed, and its run folder."""
    done = subprocess.run(
        [sys.executable, "-m", "otel_llm.kit.cli", "demo", *args],
        cwd=cwd,
        env=environment(**env),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    (folder,) = cwd.glob("otel-llm-output/demo-*")
    return done, folder


def serve_files(cwd: Path, requests: list[tuple[str, dict]], **env: str) -> tuple[int, Path]:
    """``otel-llm serve --port 0`` in ``cwd``, writing files: each ``(path, JSON body)`` of ``requests``
    answered 200, then SIGTERM. Its port (as its line says) and its run folder."""
    import http.client
    import json
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_llm.kit.cli", "serve", "--port", "0"],
        cwd=cwd,
        env=environment(PYTHONUNBUFFERED="1", OTEL_LLM_SHUTDOWN_TIMEOUT="2", **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        port = None
        deadline = time.monotonic() + 120
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, "otel-llm serve ended before it listened"
            if "listening on http://127.0.0.1:" in line:
                port = int(line.split("127.0.0.1:")[1].split()[0])
        assert port, "no line says where it listens"
        for path, body in requests:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            answer = conn.getresponse()
            assert answer.status == 200, (path, answer.status, answer.read())
            conn.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    (folder,) = cwd.glob("otel-llm-output/serve-*")
    return port, folder
