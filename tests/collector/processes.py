"""Start and stop the real Collector, Jaeger and Prometheus binaries: loopback ports, logs, bounded waits.

The binaries come from ``tests/collector/make_env.sh`` (built from pinned Go modules, cached outside the
repository). Every process a test starts is a ``Proc``; the fixture that started it stops it, so nothing
outlives its test module even when a check fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TIER = Path(
    os.environ.get("OTEL_LLM_COLLECTOR_TIER")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "otel-llm" / "collector-tier"
)
BIN = TIER / "bin"
COLLECTOR = BIN / "otelcol-otel-llm"
JAEGER = BIN / "jaeger"
PROMETHEUS = BIN / "prometheus"
START_S = 60.0  # seconds: a cold start of each binary on a loaded two-core machine stays well below


def missing_binaries() -> list[Path]:
    return [path for path in (COLLECTOR, JAEGER, PROMETHEUS) if not os.access(path, os.X_OK)]


class Proc:
    """One child process with its output in a log file; ``stop()`` ends it within seconds."""

    def __init__(
        self, name: str, argv: Sequence[str | Path], log_dir: Path, env: dict[str, str] | None = None
    ):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(
            [str(a) for a in argv],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=log_dir,
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit status."""
        if self.alive():
            self.popen.terminate()
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout_s)
        self._log.close()
        return self.popen.returncode

    def kill(self) -> int:
        """SIGKILL at once (a crash: nothing is flushed); returns the exit status."""
        if self.alive():
            self.popen.kill()
            self.popen.wait(10)
        self._log.close()
        return self.popen.returncode

    def wait_ready(self, url: str, timeout_s: float = START_S) -> None:
        """Poll ``url`` until it answers 200; fail with the process's log when it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise AssertionError(f"{self.name} exited {self.popen.returncode}:\n{self.log()[-4000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"{self.name} not ready at {url} within {timeout_s}s:\n{self.log()[-4000:]}")


def get_json(url: str, params: dict[str, str] | None = None, timeout_s: float = 10.0) -> Any:
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        return json.loads(answer.read())


def promql(prometheus_url: str, expr: str, at: float | None = None) -> list[dict]:
    """The result vector or matrix of one instant query on Prometheus's HTTP API, evaluated now or at
    ``at`` (Unix seconds)."""
    params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
    answer = get_json(f"{prometheus_url}/api/v1/query", params)
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def poll(what: str, fetch: Callable[[], Any], done: Callable[[Any], bool], timeout_s: float = 60.0) -> Any:
    """Call ``fetch`` until ``done(result)``; fail saying ``what`` with the last result."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = fetch()
        except (OSError, urllib.error.URLError) as error:
            result = error
        if not isinstance(result, Exception) and done(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s}s; last answer: {str(result)[:2000]}")
        time.sleep(0.5)


def validate(
    config_files: Sequence[Path], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The Collector's own ``validate`` command on these files (merged in order, as ``--config`` is)."""
    argv = [str(COLLECTOR), "validate", *(f"--config={path}" for path in config_files)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})
