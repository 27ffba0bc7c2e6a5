#!/usr/bin/env bash
# Build the virtualenv that serves Arize Phoenix, the trace UI the documentation's picture of a demo trace
# is taken in (.venv-phoenix at the repo root, about 0.9 GB, a minute or two).
#
# Phoenix has a dependency tree of its own (its own FastAPI, SQLAlchemy, pandas...), so it never goes into
# the development virtualenv; otel-llm is not installed in it either: Phoenix only receives OTLP.
# tests/phoenix/requirements.txt pins everything it installs. The picture is taken with Debian's
# chromium (`apt-get install chromium`), which this script does not install; the tests say so when it
# is missing.
#
# Idempotent: exits 0 at once when the virtualenv already has the pinned Phoenix. Exits non-zero when a
# step fails, unless --best-effort is given: then a failed build is removed and the Phoenix tests are
# skipped with a reason saying so. Override the location with OTEL_LLM_PHOENIX_VENV.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${OTEL_LLM_PHOENIX_VENV:-$ROOT/.venv-phoenix}"

if [ "${1:-}" = "--best-effort" ]; then
    # shellcheck source=../venv_tools.sh
    . "$ROOT/tests/venv_tools.sh"  # best_effort
    best_effort phoenix "${BASH_SOURCE[0]}" "$VENV"
    exit 0
fi

PYTHON_BIN="${PYTHON:-python3}"
# shellcheck source=../venv_tools.sh
. "$ROOT/tests/venv_tools.sh"  # pip_install
REQUIREMENTS="$ROOT/tests/phoenix/requirements.txt"
PHOENIX_VERSION="$(sed -n 's/^arize-phoenix==//p' "$REQUIREMENTS")"

probe() {
    (cd / && "$VENV/bin/python" - <<PY >/dev/null 2>&1
import importlib.metadata as md
assert md.version("arize-phoenix") == "$PHOENIX_VERSION", md.version("arize-phoenix")
import phoenix.server.main  # noqa: F401
PY
    ) && [ -x "$VENV/bin/phoenix" ]
}

if [ -x "$VENV/bin/python" ] && probe; then
    echo "make_env: $VENV already has arize-phoenix==$PHOENIX_VERSION; nothing to do"
    exit 0
fi

echo "make_env: building $VENV (arize-phoenix==$PHOENIX_VERSION, about 0.9 GB; a minute or two)"
[ -x "$VENV/bin/python" ] || "$PYTHON_BIN" -m venv "$VENV"
pip_install -r "$REQUIREMENTS"

if ! probe; then
    echo "make_env: $VENV was built but does not import arize-phoenix==$PHOENIX_VERSION" >&2
    (cd / && "$VENV/bin/python" -c "import phoenix.server.main") >&2 || true
    exit 1
fi
echo "make_env: ready: $VENV"
