#!/usr/bin/env bash
# Build the virtualenv that runs vllm-router, the router the fleet tier puts in front of two `vllm serve`
# instances (.venv-router at the repo root, about 130 MB, under a minute).
#
# vllm-router is a Rust program shipped inside a PyPI wheel (a compiled extension, `vllm_router_rs`, with
# the OpenSSL and PCRE libraries it links); its Python side is a thin wrapper. It has dependencies of its
# own (FastAPI, aiohttp) and none of vLLM's, so it gets its own small virtualenv; otel-llm is not
# installed in it: the router only sends its spans over OTLP. tests/router/requirements.txt pins
# everything it installs.
#
# Idempotent: exits 0 at once when the virtualenv already has the pinned router. Exits non-zero when a
# step fails, unless --best-effort is given: then a failed build is removed and the router tier is
# skipped with a reason saying so. Override the location with OTEL_LLM_ROUTER_VENV.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${OTEL_LLM_ROUTER_VENV:-$ROOT/.venv-router}"

if [ "${1:-}" = "--best-effort" ]; then
    # shellcheck source=../venv_tools.sh
    . "$ROOT/tests/venv_tools.sh"  # best_effort
    best_effort router "${BASH_SOURCE[0]}" "$VENV"
    exit 0
fi

PYTHON_BIN="${PYTHON:-python3}"
# shellcheck source=../venv_tools.sh
. "$ROOT/tests/venv_tools.sh"  # pip_install
REQUIREMENTS="$ROOT/tests/router/requirements.txt"
ROUTER_VERSION="$(sed -n 's/^vllm-router==//p' "$REQUIREMENTS")"

# The Router class must take the tracing arguments the tier uses (the command-line launcher has no flag
# for them), so the probe checks its signature, not just the version.
probe() {
    (cd / && "$VENV/bin/python" - <<PY >/dev/null 2>&1
import importlib.metadata as md
assert md.version("vllm-router") == "$ROUTER_VERSION", md.version("vllm-router")
import vllm_router_rs
from vllm_router import Router  # noqa: F401
signature = vllm_router_rs.Router.__text_signature__
assert "enable_trace" in signature and "otlp_traces_endpoint" in signature, signature
PY
    )
}

if [ -x "$VENV/bin/python" ] && probe; then
    echo "make_env: $VENV already has vllm-router==$ROUTER_VERSION; nothing to do"
    exit 0
fi

echo "make_env: building $VENV (vllm-router==$ROUTER_VERSION, about 130 MB; under a minute)"
[ -x "$VENV/bin/python" ] || "$PYTHON_BIN" -m venv "$VENV"
pip_install -r "$REQUIREMENTS"

if ! probe; then
    echo "make_env: $VENV was built but does not import vllm-router==$ROUTER_VERSION with its tracing" >&2
    (cd / && "$VENV/bin/python" -c "import vllm_router_rs; print(vllm_router_rs.Router.__text_signature__)") >&2 || true
    exit 1
fi
echo "make_env: ready: $VENV"
