"""The SGLang integration in a process without SGLang: the entry points load, instrument() does nothing.

Runs in a fresh interpreter of the development virtualenv (which never has SGLang), so what the
integration imports is visible in ``sys.modules``.
"""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import importlib.metadata as md, logging, sys
logging.basicConfig(level=logging.WARNING)
(ep,) = [e for e in md.entry_points(group="opentelemetry_instrumentor") if e.name == "sglang_llm"]
instrumentor = ep.load()()
instrumentor.instrument(model="m")
assert not instrumentor.is_instrumented
(plugin,) = [e for e in md.entry_points(group="sglang.srt.plugins") if e.name == "otel_llm"]
plugin.load()()
print(sorted(m for m in sys.modules if m.split(".")[0] == "sglang"))
"""


def test_without_sglang_instrument_is_a_warning_and_imports_nothing_of_sglang() -> None:
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert proc.stderr.count("SGLang is not installed") == 1, proc.stderr  # logged once, not per call
