#!/usr/bin/env bash
# Build the virtualenv that runs the API/SDK-level tests against the oldest OpenTelemetry release
# otel-llm declares (pyproject.toml), at .venv-min in the repository root (override: OTEL_LLM_MIN_VENV).
#
# otel-llm reaches into a few SDK internals (DESIGN.md names them); a test in tests/test_min_versions.py
# runs the core, wire and fault tests in this virtualenv, so the declared minimum is one the suite
# passes on. Idempotent: exits at once when the virtualenv already has the pinned versions. Exits
# non-zero when a step fails: the declared minimum is a promise, so its check is never skipped.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${OTEL_LLM_MIN_VENV:-$ROOT/.venv-min}"
PYTHON_BIN="${PYTHON:-python3}"
CONSTRAINTS="$HERE/constraints.txt"
# shellcheck source=../venv_tools.sh
. "$ROOT/tests/venv_tools.sh"  # pip_install

probe() {
    (cd / && "$VENV/bin/python" - "$CONSTRAINTS" <<'PY' >/dev/null 2>&1
import importlib.metadata as md
import sys

for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, version = line.split("==")
        assert md.version(name) == version, (name, md.version(name))
import otel_llm  # noqa: F401
PY
    )
}

if [ -x "$VENV/bin/python" ] && probe; then
    echo "make_env: $VENV already has the declared minimum OpenTelemetry; nothing to do"
    exit 0
fi

echo "make_env: building $VENV with the declared minimum OpenTelemetry (a minute or two)"
rm -rf "$VENV"
"$PYTHON_BIN" -m venv "$VENV"
pip_install --upgrade pip
# The test tools, unpinned; OpenTelemetry held at the minimum by the constraints.
pip_install -c "$CONSTRAINTS" -e "$ROOT" \
    pytest hypothesis prometheus_client pyyaml cryptography \
    opentelemetry-distro opentelemetry-exporter-prometheus
probe || { echo "make_env: $VENV does not import otel_llm at the pinned versions" >&2; exit 1; }
echo "make_env: $VENV is ready"
