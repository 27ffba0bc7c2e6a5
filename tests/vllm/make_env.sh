#!/usr/bin/env bash
# Build a virtualenv of the vLLM scheduler tier: vLLM's real scheduler, output processor and config
# classes, driven step by step by tests/vllm/drive_scheduler.py (no model, no GPU).
#
#   bash tests/vllm/make_env.sh [VERSION] [--best-effort]
#
# VERSION is any vLLM release on PyPI (else $OTEL_LLM_VLLM_VERSION, else 0.34.0, the newest release of
# the tested range in otel_llm/integrations/versions.py; a test checks the two agree). The virtualenv is
# .venv-vllm-VERSION at the repository root (OTEL_LLM_VLLM_VENV: another place). CI builds the range's
# two ends; tests/vllm/check_release.sh builds any release and runs the tier on it, in one command.
#
# vLLM pins its own torch and pulls a large dependency tree, so it never goes into the development
# virtualenv. We install vLLM without its dependencies and add, pinned, only what its scheduler, output
# processor and config classes import; torch stays at 2.13.0 (PyPI's default build). The pins are the
# same for every release tested (0.30.0 to 0.34.0); a release that imports something new fails the
# probe below, which prints the import error.
#
# Idempotent: exits 0 at once when the virtualenv already imports that vLLM and otel_llm. Exits non-zero
# when any step fails, unless --best-effort is given: then a failed build is removed and the tier skips
# that release's tests with a reason saying so.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BEST_EFFORT=""
VLLM_VERSION="${OTEL_LLM_VLLM_VERSION:-0.34.0}"
for arg in "$@"; do
    case "$arg" in
        --best-effort) BEST_EFFORT=1 ;;
        -*) echo "make_env: unknown option $arg (usage: make_env.sh [VERSION] [--best-effort])" >&2; exit 2 ;;
        *) VLLM_VERSION="$arg" ;;
    esac
done
VENV="${OTEL_LLM_VLLM_VENV:-$ROOT/.venv-vllm-$VLLM_VERSION}"

if [ -n "$BEST_EFFORT" ]; then
    # shellcheck source=../venv_tools.sh
    . "$ROOT/tests/venv_tools.sh"  # best_effort
    OTEL_LLM_VLLM_VERSION="$VLLM_VERSION" OTEL_LLM_VLLM_VENV="$VENV" \
        best_effort "vllm-$VLLM_VERSION" "${BASH_SOURCE[0]}" "$VENV"
    exit 0
fi

PYTHON_BIN="${PYTHON:-python3}"
# shellcheck source=../venv_tools.sh
. "$ROOT/tests/venv_tools.sh"  # pip_install, install_torch, TORCH_PIN

# The readiness probe: the pinned vLLM is installed, the classes the test drives import, otel_llm imports
# with its vLLM plugin registered.
probe() {
    # From / so that the repository checkout itself is not on sys.path: the installed package must work.
    (cd / && "$VENV/bin/python" - <<PY >/dev/null 2>&1
import importlib.metadata as md
assert md.version("vllm") == "$VLLM_VERSION", md.version("vllm")
import vllm.v1.core.sched.scheduler  # noqa: F401
import vllm.v1.engine.output_processor  # noqa: F401
from otel_llm import RequestTracker  # noqa: F401
# The entry points come from the installed metadata: reinstall when pyproject.toml gained them.
assert "otel_llm" in md.entry_points(group="vllm.general_plugins").names
PY
    )
}

if [ -x "$VENV/bin/python" ] && probe; then
    echo "make_env: $VENV already has vllm==$VLLM_VERSION and otel_llm; nothing to do"
    exit 0
fi

echo "make_env: building $VENV with vllm==$VLLM_VERSION (about 1.3 GB, plus the 4.7 GB torch tree shared by hard links; a few minutes)"
[ -x "$VENV/bin/python" ] || "$PYTHON_BIN" -m venv "$VENV"

# 1. torch first, so nothing below can choose another build.
install_torch

# 2. vLLM itself without dependencies: with them it would replace torch 2.13.0 by the one it pins.
pip_install --no-deps "vllm==$VLLM_VERSION"

# 3. What vLLM's Python code imports on the scheduler / output-processor / config path.
#    torch is repeated so that the resolver keeps it where it is.
pip_install "$TORCH_PIN" \
    packaging==26.4 numpy==2.4.6 pydantic==2.14.4 regex==2026.11.19 cbor2==6.3.0 \
    psutil==7.2.2 pyzmq==27.3.0 urllib3==2.8.0 transformers==5.20.2 aiohttp==3.14.5 \
    requests==2.34.2 openai-harmony==0.0.8 openai==3.57.0 pillow==13.0.0 pybase64==1.5.1 \
    cachetools==8.0.2 msgspec==0.23.0 cloudpickle==3.1.3 uvloop==0.23.0 py-cpuinfo==9.0.0 \
    prometheus_client==0.26.0 fastapi==0.136.3 partial-json-parser==0.2.1.1.post7 \
    llguidance==1.7.6 einops==0.8.2

# 4. Structured-output packages without dependencies (xgrammar's would pull triton, about 1 GB).
pip_install --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.11

# 5. OpenTelemetry at the same versions as the development environment, then otel_llm itself.
pip_install "$TORCH_PIN" \
    opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2 \
    opentelemetry-proto==1.45.2 opentelemetry-exporter-otlp==1.45.2 \
    opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-exporter-otlp-proto-grpc==1.45.2 \
    opentelemetry-exporter-otlp-proto-common==1.45.2 protobuf==7.36.2 grpcio==1.85.3 \
    googleapis-common-protos==1.76.0
pip_install --no-deps --no-build-isolation -e "$ROOT"

if ! probe; then
    echo "make_env: $VENV was built but does not import vllm==$VLLM_VERSION and otel_llm" >&2
    "$VENV/bin/python" -c "import vllm.v1.engine.output_processor, otel_llm" >&2 || true
    exit 1
fi
echo "make_env: ready: $VENV"
