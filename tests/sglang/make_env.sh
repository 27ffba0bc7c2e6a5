#!/usr/bin/env bash
# Build the separate virtualenv that the SGLang tests drive (.venv-sglang at the repo root).
#
# SGLang pins a CUDA torch and pulls CUDA-only kernels, so it never goes into the development
# virtualenv.  We install SGLang without its dependencies and add, pinned, what its engine, scheduler
# and HTTP server import on a CPU; torch stays at 2.13.0 (PyPI's default build, CUDA-enabled, run here on the CPU).  Two test stand-ins are wired in
# through a .pth file (see tests/sglang/standins/): a torch version of the one sgl_kernel function the
# CPU path calls, and the torchvision operator schemas that a CUDA torchvision wheel needs to import.
#
#   bash tests/sglang/make_env.sh [VERSION] [--best-effort]
#
# VERSION: another SGLang release (else $OTEL_LLM_SGLANG_VERSION, else 0.5.23), built into
# .venv-sglang-VERSION with the same pins; the tier runs on it with OTEL_LLM_SGLANG_PYTHON pointing there.
#
# Idempotent: exits 0 at once when the virtualenv already imports the pinned SGLang and otel_llm.
# Exits non-zero when any step fails, unless --best-effort is given: then a failed build is removed and
# the SGLang tests are skipped with a reason saying so.  Override the location with OTEL_LLM_SGLANG_VENV.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEFAULT_VERSION="0.5.23"
SGLANG_VERSION="${OTEL_LLM_SGLANG_VERSION:-$DEFAULT_VERSION}"
BEST_EFFORT=""
for arg in "$@"; do
    case "$arg" in
        --best-effort) BEST_EFFORT=1 ;;
        -*) echo "make_env: unknown option $arg (usage: make_env.sh [VERSION] [--best-effort])" >&2; exit 2 ;;
        *) SGLANG_VERSION="$arg" ;;
    esac
done
if [ "$SGLANG_VERSION" = "$DEFAULT_VERSION" ]; then
    VENV="${OTEL_LLM_SGLANG_VENV:-$ROOT/.venv-sglang}"
else
    VENV="${OTEL_LLM_SGLANG_VENV:-$ROOT/.venv-sglang-$SGLANG_VERSION}"
fi

if [ -n "$BEST_EFFORT" ]; then
    # shellcheck source=../venv_tools.sh
    . "$ROOT/tests/venv_tools.sh"  # best_effort
    name=sglang
    [ "$SGLANG_VERSION" = "$DEFAULT_VERSION" ] || name="sglang-$SGLANG_VERSION"
    OTEL_LLM_SGLANG_VERSION="$SGLANG_VERSION" OTEL_LLM_SGLANG_VENV="$VENV" \
        best_effort "$name" "${BASH_SOURCE[0]}" "$VENV"
    exit 0
fi

PYTHON_BIN="${PYTHON:-python3}"
# shellcheck source=../venv_tools.sh
. "$ROOT/tests/venv_tools.sh"  # pip_install, install_torch, TORCH_PIN
STANDINS="$ROOT/tests/sglang/standins"

probe() {
    # From / so that the repository checkout is not on sys.path: the installed package must work.
    (cd / && SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" - <<PY >/dev/null 2>&1
import importlib.metadata as md
assert md.version("sglang") == "$SGLANG_VERSION", md.version("sglang")
import sgl_kernel
assert sgl_kernel.STAND_IN
import sglang.srt.managers.scheduler  # noqa: F401
import sglang.srt.entrypoints.http_server  # noqa: F401
from otel_llm import RequestTracker  # noqa: F401
assert "otel_llm" in md.entry_points(group="sglang.srt.plugins").names
PY
    )
}

if [ -x "$VENV/bin/python" ] && probe; then
    echo "make_env: $VENV already has sglang==$SGLANG_VERSION and otel_llm; nothing to do"
    exit 0
fi

echo "make_env: building $VENV (about 1 GB, plus the 4.7 GB torch tree shared by hard links; a few minutes)"
[ -x "$VENV/bin/python" ] || "$PYTHON_BIN" -m venv "$VENV"

# 1. torch first, so nothing below can choose another build.
install_torch

# 2. SGLang without dependencies (with them: CUDA torch and kernels), torchvision likewise (a CUDA
#    build on PyPI, like torch), triton (SGLang imports it at start-up; 3.7.1 is the version that
#    torch 2.13.0 itself requires).
pip_install --no-deps "sglang==$SGLANG_VERSION" torchvision==0.28.0
pip_install "$TORCH_PIN" triton==3.7.1

# 3. What SGLang's engine, scheduler and HTTP server import on a CPU, pinned (found by running them).
pip_install --no-deps "$TORCH_PIN" \
    aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7 annotated-types==0.8.0 \
    anyio==4.16.0 apache-tvm-ffi==0.1.11 asttokens==3.0.2 attrs==26.1.0 blobfile==3.0.0 \
    certifi==2026.10.19.post1 cffi==2.1.1 charset-normalizer==3.5.3 click==8.5.1 \
    compressed-tensors==0.18.0 dill==0.4.1 distro==1.9.0 einops==0.8.2 executing==2.3.0 \
    fastapi==0.165.0 filelock==4.3.1 frozenlist==1.8.0 fsspec==2026.9.0 gguf==0.19.0 h11==0.16.0 \
    hf-xet==1.8.0 httpcore==1.0.9 httpx==0.28.1 huggingface_hub==1.33.0 idna==3.20 interegular==0.3.3 \
    ipython==9.18.1 ipython_pygments_lexers==1.1.1 jedi==0.20.1 Jinja2==3.1.6 jiter==0.19.0 \
    llguidance==1.7.6 loguru==0.7.3 lxml==6.1.3 markdown-it-py==4.3.0 MarkupSafe==3.0.4 \
    matplotlib-inline==0.2.2 mdurl==0.1.2 mpmath==1.3.0 msgspec==0.23.0 multidict==7.2.1 \
    networkx==3.6.1 numpy==2.4.6 openai==2.8.0 openai-harmony==0.0.4 orjson==3.13.0 packaging==26.4 \
    parso==0.8.7 partial-json-parser==0.2.1.1.post7 pexpect==4.9.0 pillow==13.0.0 \
    prometheus_client==0.26.0 prompt_toolkit==3.0.53 propcache==0.5.4 psutil==7.2.2 ptyprocess==0.7.0 \
    pure_eval==0.2.4 pybase64==1.5.1 pycparser==3.12 pycryptodomex==3.24.2 pydantic==2.14.4 \
    pydantic_core==2.50.5 Pygments==2.21.0 python-multipart==0.0.34 PyYAML==6.0.4 pyzmq==27.3.0 \
    regex==2026.11.19 requests==2.34.2 rich==15.0.0 safetensors==0.8.0 scipy==1.17.1 \
    sentencepiece==0.2.1 setproctitle==1.3.8 shellingham==1.5.4 sniffio==1.3.1 soundfile==0.13.1 \
    stack-data==0.6.3 starlette==1.10.0 sympy==1.14.0 tiktoken==0.14.0 tokenizers==0.23.2 tqdm==4.70.1 \
    traitlets==5.16.1 transformers==5.19.0 typer==0.29.2 typing-inspection==0.4.5 \
    typing_extensions==4.16.0 urllib3==2.8.0 uvicorn==0.54.0 uvloop==0.23.0 watchfiles==1.3.0 \
    wcwidth==0.9.4 xgrammar==0.2.7 xxhash==4.1.0 yarl==1.25.1 zstandard==0.25.0 jsonschema==4.26.0 \
    jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1

# 4. OpenTelemetry at the development environment's versions (SGLang's --enable-trace uses it too),
#    then otel_llm itself, editable, so SGLang finds the plugin through the installed entry points.
pip_install "$TORCH_PIN" \
    opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2 \
    opentelemetry-proto==1.45.2 opentelemetry-exporter-otlp==1.45.2 \
    opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-exporter-otlp-proto-grpc==1.45.2 \
    opentelemetry-exporter-otlp-proto-common==1.45.2 protobuf==7.36.2 grpcio==1.85.3 \
    googleapis-common-protos==1.76.0
pip_install --no-deps --no-build-isolation -e "$ROOT"

# 5. The stand-ins, from a .pth file (runs in every process of this virtualenv, also under
#    opentelemetry-instrument, whose own sitecustomize would shadow one of ours).
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
printf '%s\nimport otel_llm_sglang_standins; otel_llm_sglang_standins.install()\n' "$STANDINS" \
    > "$SITE/otel_llm_sglang_standins.pth"

if ! probe; then
    echo "make_env: $VENV was built but does not import sglang==$SGLANG_VERSION and otel_llm" >&2
    (cd / && SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -c "import sglang.srt.managers.scheduler, otel_llm") >&2 || true
    exit 1
fi
echo "make_env: ready: $VENV"
