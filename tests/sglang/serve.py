"""SGLang's HTTP server started as docs/sglang.md says, and that page's commands read back.

``readme_server_commands()`` returns docs/sglang.md's two SGLang server blocks (the general one and the
CPU one the tests run); ``Server`` starts the CPU one as a subprocess, word for word except for the
model path, the port and the collector endpoint, which are this test's, and stops it again.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

from tests.sglang.conftest import REPO, SGLANG_PYTHON, sglang_env

README_MODEL = "my-model"
README_PORT = "30000"
README_ENDPOINT = "http://localhost:4317"
SGLANG_PAGE = "docs/sglang.md"  # the page with the server blocks; README_*: words of those blocks
CPU_MARKER = "On a CPU-only machine"
READY_TIMEOUT_S = 180.0  # start-up is about 16 s alone; far more on a loaded 2-core machine


def readme_server_commands() -> tuple[list[str], list[str]]:
    """The command lines (comments and blank lines dropped) of docs/sglang.md's SGLang server blocks:
    (the general block, the CPU block that follows the CPU marker)."""
    text = (REPO / SGLANG_PAGE).read_text()
    section = text.split("SGLang 0.5.23", 1)[1]
    block = re.compile(r"```bash\n(.*?)```", re.S)
    general = block.search(section)
    cpu = block.search(section, section.index(CPU_MARKER))
    missing = f"{SGLANG_PAGE}'s SGLang server blocks are missing"
    assert general and cpu and general.start() < cpu.start(), missing
    return _lines(general.group(1)), _lines(cpu.group(1))


def _lines(block: str) -> list[str]:
    out = []
    for line in block.splitlines():
        line = line.split("  #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def command_and_env(
    lines: list[str], model: Path, port: int, endpoint: str
) -> tuple[list[str], dict[str, str]]:
    """docs/sglang.md's CPU lines as (argv, environment additions), with this test's model, port, endpoint."""
    env: dict[str, str] = {}
    argv: list[str] = []
    for line in lines:
        line = line.replace(README_ENDPOINT, endpoint)
        words = shlex.split(line)
        if words[0] == "export":
            env.update(word.split("=", 1) for word in words[1:])  # type: ignore[arg-type]
        elif words[:3] == ["python", "-m", "sglang.launch_server"]:
            argv = [str(SGLANG_PYTHON), *words[1:]]
        elif words[:2] != ["pip", "install"]:  # otel-llm is installed (editable) in the test virtualenv
            raise AssertionError(f"a {SGLANG_PAGE} line the test does not know how to run: {line}")
    assert argv, f"no launch_server line in {SGLANG_PAGE}'s CPU block"
    argv = [str(model) if w == README_MODEL else str(port) if w == README_PORT else w for w in argv]
    return argv, env


class Server:
    """``python -m sglang.launch_server`` as docs/sglang.md's CPU block starts it, in its own session."""

    def __init__(self, model: Path, port: int, endpoint: str, log: Path, extra_env: dict[str, str]) -> None:
        _, cpu = readme_server_commands()
        self.argv, readme_env = command_and_env(cpu, model, port, endpoint)
        self.env = {**sglang_env(), **readme_env, **extra_env}
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self._log_file: IO[Any] | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        self._log_file = self.log.open("wb")
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.log.parent,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its scheduler and detokenizer processes join this group
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"launch_server exited {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"launch_server was not ready within {READY_TIMEOUT_S:.0f} s:\n{self.tail()}")

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=10) as answer:
            return answer.read().decode()

    def stop(self) -> None:
        """SIGTERM to the server's process group (the server and the processes it started), then SIGKILL."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(wait_s)
                    break
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    continue
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # children left behind by a server that exited
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def tail(self, chars: int = 6000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""
