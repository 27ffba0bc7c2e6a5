"""The collector tier: skipped, with the reason, when ``tests/collector/make_env.sh`` built no binaries.

``.ci/run`` builds them (``make_env.sh --best-effort``), so in CI these tests run whenever the build did.
"""

from __future__ import annotations

import pytest

from tests.collector.processes import BIN, missing_binaries


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = missing_binaries()
    if not missing:
        return
    skip = pytest.mark.skip(
        reason=f"collector tier not built ({', '.join(p.name for p in missing)} missing in {BIN}): "
        "run `bash tests/collector/make_env.sh` (Go 1.26 and the Go module proxy; several minutes cold)"
    )
    for item in items:
        if "tests/collector/" in item.nodeid.replace("\\", "/"):
            item.add_marker(skip)
