#!/usr/bin/env bash
# Check a vLLM release against otel-llm in one command: build that release's scheduler-tier virtualenv
# (.venv-vllm-VERSION, tests/vllm/make_env.sh) and run the scheduler tier on it alone.
#
#   bash tests/vllm/check_release.sh 0.35.0
#
# Run it in the development virtualenv (the README's command 2), from anywhere. The tier is every test
# file of tests/vllm that uses needs_vllm (vLLM's real scheduler and output processor, no model); its
# exit status is this script's. A release that passes can join the tested range
# (otel_llm/integrations/versions.py; docs/development.md says what else to change).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION="${1:-}"
if [ -z "$VERSION" ] || [ "$#" -ne 1 ]; then
    echo "usage: bash tests/vllm/check_release.sh VERSION   (a vLLM release on PyPI, e.g. 0.35.0)" >&2
    exit 2
fi

bash "$ROOT/tests/vllm/make_env.sh" "$VERSION"
cd "$ROOT"
mapfile -t TIER < <(grep -l "needs_vllm" tests/vllm/test_*.py)
echo "check_release: the scheduler tier on vLLM $VERSION: ${TIER[*]}"
unset OTEL_LLM_VLLM_PYTHON  # it would name another interpreter than this release's
OTEL_LLM_VLLM_VERSIONS="$VERSION" exec "${PYTHON:-python}" -m pytest -p no:xdist -q "${TIER[@]}"
